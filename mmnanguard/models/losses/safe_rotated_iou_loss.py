# Copyright (c) mmnanguard contributors. All rights reserved.
"""A rotated IoU loss whose gradient stays finite."""

import warnings
from typing import Optional, Union

import torch
import torch.nn as nn
from torch import Tensor

from mmnanguard.registry import MODELS, register_shared

from .diff_rotated_iou import diff_rotated_iou
from .utils import safe_weight_reduce_loss

_MODES = ('linear', 'square', 'log')
_REDUCTIONS = (None, 'none', 'mean', 'sum')


def safe_rotated_iou_loss(
    pred: Tensor,
    target: Tensor,
    weight: Optional[Tensor] = None,
    mode: str = 'log',
    eps: float = 1e-6,
    reduction: str = 'mean',
    avg_factor: Optional[float] = None,
) -> Tensor:
    """Rotated IoU loss with IoU clamped to ``[eps, 1]``.

    Args:
        pred (Tensor): Predicted boxes (N, 5) as (cx, cy, w, h, angle).
        target (Tensor): Target boxes (N, 5).
        weight (Tensor, optional): Weight (N, ). Defaults to None.
        mode (str): 'linear' (``1 - iou``), 'square' (``1 - iou^2``) or
            'log' (``-log iou``). Defaults to 'log'.
        eps (float): Lower bound of the IoU. Defaults to 1e-6.
        reduction (str): 'none', 'mean' or 'sum'. Defaults to 'mean'.
        avg_factor (float, optional): Divisor of the mean. Defaults to None.

    Returns:
        Tensor: Loss, in at least fp32 (the mean of no boxes is 0).
    """
    ious = diff_rotated_iou(pred, target).clamp(min=eps, max=1.0)
    if mode == 'linear':
        loss = 1 - ious
    elif mode == 'square':
        loss = 1 - ious**2
    else:
        loss = -ious.log()
    return safe_weight_reduce_loss(loss, weight, reduction, avg_factor)


@register_shared(MODELS)
class SafeRotatedIoULoss(nn.Module):
    """Drop-in for mmrotate's ``RotatedIoULoss`` with finite gradients.

    Same arguments and formula. It differs in how it computes:

    - the IoU comes from :func:`diff_rotated_iou` (plain PyTorch, so it
      also runs on the CPU), whose divisions have safe denominators;
    - it computes in fp32 (float64 stays float64) with autocast disabled:
      ``pred.float()`` *and* ``torch.autocast(enabled=False)``;
    - the IoU is clamped to ``[eps, 1]`` (upstream: ``[eps, inf)``), and
      the union area to at least 1e-6 before the division, so that two
      zero-area boxes give ``IoU = eps`` instead of ``0 / 0``;
    - the all-zero-weight shortcut returns a zero connected to ``pred``
      through ``torch.where`` (upstream's ``(pred * weight).sum()`` is NaN
      for an infinite ``pred``).

    Args:
        linear (bool): Deprecated; same as ``mode='linear'``.
            Defaults to False.
        eps (float): Lower bound of the IoU. Defaults to 1e-6.
        reduction (str): 'none', 'mean' or 'sum'. Defaults to 'mean'.
        loss_weight (float): Weight of the loss. Defaults to 1.0.
        mode (str): 'linear', 'square' or 'log'. Defaults to 'log'.

    Example:
        >>> loss_bbox = dict(type='SafeRotatedIoULoss', loss_weight=1.0)
    """

    def __init__(
        self,
        linear: bool = False,
        eps: float = 1e-6,
        reduction: str = 'mean',
        loss_weight: float = 1.0,
        mode: str = 'log',
    ) -> None:
        super().__init__()
        if mode not in _MODES:
            raise ValueError(
                'SafeRotatedIoULoss: mode must be one of '
                f'{_MODES}, got {mode!r}'
            )
        if reduction not in _REDUCTIONS[1:]:
            raise ValueError(
                "SafeRotatedIoULoss: reduction must be 'none', "
                f"'mean' or 'sum', got {reduction!r}"
            )
        if not 0 < eps < 1:
            raise ValueError(
                f'SafeRotatedIoULoss: eps must lie in (0, 1), got {eps!r}'
            )
        if linear:
            mode = 'linear'
            warnings.warn(
                'SafeRotatedIoULoss: linear=True is deprecated, '
                "use mode='linear'",
                stacklevel=2,
            )
        self.linear = linear
        self.mode = mode
        self.eps = eps
        self.reduction = reduction
        self.loss_weight = loss_weight

    def forward(
        self,
        pred: Tensor,
        target: Tensor,
        weight: Optional[Tensor] = None,
        avg_factor: Optional[Union[int, float]] = None,
        reduction_override: Optional[str] = None,
    ) -> Tensor:
        """Compute the loss.

        Args:
            pred (Tensor): Predicted boxes (N, 5).
            target (Tensor): Target boxes (N, 5).
            weight (Tensor, optional): Weight (N, ) or (N, 5) (averaged
                over the last dimension, as upstream). Defaults to None.
            avg_factor (int | float, optional): Divisor of the mean.
                Defaults to None.
            reduction_override (str, optional): 'none', 'mean' or 'sum'.
                Defaults to None.

        Returns:
            Tensor: The loss.
        """
        if reduction_override not in _REDUCTIONS:
            raise ValueError(
                'SafeRotatedIoULoss: reduction_override must be None, '
                f"'none', 'mean' or 'sum', got {reduction_override!r}"
            )
        if pred.shape != target.shape or pred.size(-1) != 5:
            raise ValueError(
                'SafeRotatedIoULoss: pred and target must both have shape '
                f'(N, 5), got {tuple(pred.shape)} and '
                f'{tuple(target.shape)}'
            )
        reduction = reduction_override or self.reduction
        if weight is not None and weight.dim() > 1:
            if weight.shape != pred.shape:
                raise ValueError(
                    'SafeRotatedIoULoss: a 2-D weight must have the shape '
                    f'of pred {tuple(pred.shape)}, got {tuple(weight.shape)}'
                )
            weight = weight.mean(-1)
        if (
            weight is not None
            and not torch.any(weight > 0)
            and reduction != 'none'
        ):
            keep = (weight > 0).unsqueeze(-1)
            return torch.where(keep, pred, torch.zeros_like(pred)).sum()
        with torch.autocast(device_type=pred.device.type, enabled=False):
            dtype = torch.promote_types(pred.dtype, torch.float32)
            loss = safe_rotated_iou_loss(
                pred.to(dtype),
                target.to(dtype),
                None if weight is None else weight.to(dtype),
                mode=self.mode,
                eps=self.eps,
                reduction=reduction,
                avg_factor=avg_factor,
            )
        return self.loss_weight * loss
