# Copyright (c) mmnanguard contributors. All rights reserved.
"""A continuous angle coder: ``(sin k theta, cos k theta)``."""

import math

import torch
from mmdet.models.task_modules.coders.base_bbox_coder import BaseBBoxCoder
from torch import Tensor

from mmnanguard.registry import TASK_UTILS, register_shared

#: angle version -> (start of the range, period of the box angle).
ANGLE_RANGES = {
    'le90': (-math.pi / 2, math.pi),
    'le135': (-math.pi / 4, math.pi),
    'oc': (-math.pi / 2, math.pi / 2),
}


@register_shared(TASK_UTILS)
class SinCosAngleCoder(BaseBBoxCoder):
    """Encode an angle as ``(sin k theta, cos k theta)``.

    A rotated box repeats with period ``P`` in its angle (``pi`` for 'le90'
    and 'le135', ``pi / 2`` for 'oc', where w and h swap). With
    ``k = 2 pi / P`` the encoding has the same period, so it is continuous
    across the ends of the range: there is no jump at ``±pi/2`` for
    'le90'. ``decode`` inverts it with ``atan2`` into
    ``[start, start + P)``; the two ends of that range are the same box, so
    an input on the boundary may come back at the other end (the same
    angle modulo ``P``).

    Args:
        angle_version (str): 'le90', 'le135' or 'oc'. Defaults to 'le90'.

    Example:
        >>> # mmrotate head config (RotatedFCOSHead, RotatedRTMDetHead,
        >>> # AngleBranchRetinaHead, H2RBoxHead):
        >>> angle_coder = dict(type='SinCosAngleCoder', angle_version='le90')
    """

    encode_size = 2

    def __init__(self, angle_version: str = 'le90') -> None:
        super().__init__()
        if angle_version not in ANGLE_RANGES:
            raise ValueError(
                'SinCosAngleCoder: angle_version must be one of '
                f'{tuple(ANGLE_RANGES)}, got {angle_version!r}'
            )
        self.angle_version = angle_version
        self.start, self.period = ANGLE_RANGES[angle_version]
        self.k = 2 * math.pi / self.period

    def encode(self, angle_targets: Tensor) -> Tensor:
        """Encode angles.

        Args:
            angle_targets (Tensor): Angles in radians, shape (..., 1).

        Returns:
            Tensor: ``(sin k theta, cos k theta)``, shape (..., 2).

        Raises:
            ValueError: If the last dimension is not 1.
        """
        if angle_targets.dim() == 0 or angle_targets.size(-1) != 1:
            raise ValueError(
                'SinCosAngleCoder.encode: angle_targets must have shape '
                f'(..., 1), got {tuple(angle_targets.shape)}'
            )
        phase = self.k * angle_targets
        return torch.cat([torch.sin(phase), torch.cos(phase)], dim=-1)

    def decode(self, angle_preds: Tensor, keepdim: bool = False) -> Tensor:
        """Decode ``(sin, cos)`` pairs into angles in ``[start, start+P)``.

        The pair need not be normalised: ``atan2`` uses only its direction.
        A pair of exact zeros has no direction: it decodes to angle 0
        (mapped into the range) with zero gradient, where a plain
        ``atan2`` would give a NaN gradient.

        Args:
            angle_preds (Tensor): Encoded angles, shape (..., 2).
            keepdim (bool): Keep the last dimension (size 1).
                Defaults to False.

        Returns:
            Tensor: Angles, shape (..., 1) if ``keepdim`` else (...).

        Raises:
            ValueError: If the last dimension is not 2.
        """
        if angle_preds.dim() == 0 or angle_preds.size(-1) != 2:
            raise ValueError(
                'SinCosAngleCoder.decode: angle_preds must have shape '
                f'(..., 2), got {tuple(angle_preds.shape)}'
            )
        if angle_preds.numel() == 0:
            shape = list(angle_preds.shape[:-1]) + ([1] if keepdim else [])
            return angle_preds.new_zeros(shape)
        sin, cos = angle_preds.unbind(dim=-1)
        zero = (sin == 0) & (cos == 0)
        sin = torch.where(zero, 0.0, sin)
        cos = torch.where(zero, 1.0, cos)
        angle = torch.atan2(sin, cos) / self.k
        angle = torch.remainder(angle - self.start, self.period) + self.start
        return angle.unsqueeze(-1) if keepdim else angle
