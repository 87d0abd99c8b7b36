# Copyright (c) mmnanguard contributors. All rights reserved.
"""mmrotate's ``DeltaXYWHTRBBoxCoder`` with the ``log`` of a zero-size box
made finite.

Upstream encodes ``log(gw / pw)``: a zero-width or zero-height ground
truth (degenerate DOTA polygons) gives ``-inf`` and a NaN L1 loss. The
safe coder replaces only non-positive widths and heights, so that every
target upstream computes finitely is returned unchanged. Decoding returns
exactly what upstream returns; bounding the decoded boxes further is an
explicit option (``regularize_decode``).
"""

import math
from typing import Optional, Sequence, Union

import torch
from mmdet.structures.bbox import get_box_tensor
from mmrotate.models.task_modules.coders import DeltaXYWHTRBBoxCoder
from mmrotate.structures.bbox import RotatedBoxes
from mmrotate.structures.bbox.transforms import norm_angle
from torch import Tensor

from mmnanguard.registry import TASK_UTILS, register_shared

ANGLE_VERSIONS = ('oc', 'le135', 'le90')


def regularize_oc(w: Tensor, h: Tensor, t: Tensor):
    """Bring ``t`` into the 'oc' range ``[-pi/2, 0)``, swapping w and h.

    Same rule as ``RotatedBoxes.regularize_boxes('oc')``: the box is
    unchanged, only its representation.
    """
    t = torch.remainder(t + math.pi / 2, math.pi)
    first = t < math.pi / 2
    w_, h_ = torch.where(first, w, h), torch.where(first, h, w)
    t = torch.where(first, t, t - math.pi / 2) - math.pi / 2
    return w_, h_, t


def _positive(size: Tensor, eps: float) -> Tensor:
    """``size`` with its zero and negative entries replaced by ``eps``."""
    return torch.where(size <= 0, torch.full_like(size, eps), size)


def safe_bbox2delta(
    proposals: Tensor,
    gts: Tensor,
    means: Sequence[float] = (0.0, 0.0, 0.0, 0.0, 0.0),
    stds: Sequence[float] = (1.0, 1.0, 1.0, 1.0, 1.0),
    angle_version: str = 'oc',
    norm_factor: Optional[float] = None,
    edge_swap: bool = False,
    proj_xy: bool = False,
    eps: float = 1e-6,
) -> Tensor:
    """Upstream ``bbox2delta`` with widths and heights clamped to ``eps``.

    Args:
        proposals (Tensor): Boxes (N, 5) as (cx, cy, w, h, t).
        gts (Tensor): Regularized ground truth (N, 5).
        means (Sequence[float]): Means of the deltas.
        stds (Sequence[float]): Standard deviations of the deltas.
        angle_version (str): 'oc', 'le135' or 'le90'.
        norm_factor (float, optional): Angle normalisation factor.
        edge_swap (bool): Swap edges if that gives a smaller angle.
        proj_xy (bool): Project the centre offset on the proposal axes.
        eps (float): Replaces every width and height (proposal and
            ground truth) that is zero or negative, before the division
            and the ``log``; positive sizes are kept, so the result is
            upstream's wherever upstream's is finite. NaN stays NaN.

    Returns:
        Tensor: Deltas (N, 5), fp32.
    """
    proposals = proposals.float()
    gts = gts.float()
    px, py, pw, ph, pt = proposals.unbind(dim=-1)
    gx, gy, gw, gh, gt = gts.unbind(dim=-1)
    pw, ph, gw, gh = (_positive(v, eps) for v in (pw, ph, gw, gh))
    if proj_xy:
        dx = (torch.cos(pt) * (gx - px) + torch.sin(pt) * (gy - py)) / pw
        dy = (-torch.sin(pt) * (gx - px) + torch.cos(pt) * (gy - py)) / ph
    else:
        dx = (gx - px) / pw
        dy = (gy - py) / ph
    if edge_swap:
        dtheta1 = norm_angle(gt - pt, angle_version)
        dtheta2 = norm_angle(gt - pt + math.pi / 2, angle_version)
        first = torch.abs(dtheta1) < torch.abs(dtheta2)
        dw = torch.log(torch.where(first, gw, gh) / pw)
        dh = torch.log(torch.where(first, gh, gw) / ph)
        dt = torch.where(first, dtheta1, dtheta2)
    else:
        dt = norm_angle(gt - pt, angle_version)
        dw = torch.log(gw / pw)
        dh = torch.log(gh / ph)
    if norm_factor:
        dt = dt / (norm_factor * math.pi)
    deltas = torch.stack([dx, dy, dw, dh, dt], dim=-1)
    means_t = deltas.new_tensor(means).unsqueeze(0)
    stds_t = deltas.new_tensor(stds).unsqueeze(0)
    return (deltas - means_t) / stds_t


def safe_delta2bbox(
    rois: Tensor,
    deltas: Tensor,
    means: Sequence[float] = (0.0, 0.0, 0.0, 0.0, 0.0),
    stds: Sequence[float] = (1.0, 1.0, 1.0, 1.0, 1.0),
    max_shape: Optional[Sequence[int]] = None,
    wh_ratio_clip: float = 16 / 1000,
    add_ctr_clamp: bool = False,
    ctr_clamp: int = 32,
    angle_version: str = 'oc',
    norm_factor: Optional[float] = None,
    edge_swap: bool = False,
    proj_xy: bool = False,
    regularize: bool = False,
) -> Tensor:
    """Upstream ``delta2bbox`` in fp32; with ``regularize``, bounded.

    Without ``regularize`` the result is upstream's (same formulas, same
    clamps, same representation) computed in fp32.

    Args:
        rois (Tensor): Base boxes (N, 5).
        deltas (Tensor): Deltas (N, 5 * k).
        means (Sequence[float]): Means of the deltas.
        stds (Sequence[float]): Standard deviations of the deltas.
        max_shape (Sequence[int], optional): (H, W) bounds of the centres.
        wh_ratio_clip (float): ``dw`` and ``dh`` are clamped to
            ``±|log(wh_ratio_clip)|`` (only the upper side when
            ``add_ctr_clamp`` and not ``regularize``, as upstream).
        add_ctr_clamp (bool): Clamp the centre shift to ``ctr_clamp``.
        ctr_clamp (int): Maximum centre shift in pixels.
        angle_version (str): 'oc', 'le135' or 'le90'.
        norm_factor (float, optional): Angle normalisation factor.
        edge_swap (bool): Make the width the longer edge.
        proj_xy (bool): Project the centre offset on the roi axes.
        regularize (bool): Clamp ``dw``/``dh`` on both sides in every mode
            (no box shrinks to zero width), and bring the 'oc' angle, which
            upstream leaves unbounded, into ``[-pi/2, 0)`` by the
            ``regularize_boxes('oc')`` rule (w and h swap, the box itself is
            unchanged). Defaults to False.

    Returns:
        Tensor: Boxes (N, 5 * k), fp32.
    """
    if deltas.size(0) == 0:
        return deltas.float()
    rois = rois.float()
    deltas = deltas.float()
    means_t = deltas.new_tensor(means).view(1, -1)
    stds_t = deltas.new_tensor(stds).view(1, -1)
    denorm = deltas.view(deltas.shape[:-1] + (-1, 5)) * stds_t + means_t
    dx, dy, dw, dh, dt = denorm.unbind(dim=-1)
    if norm_factor:
        dt = dt * (norm_factor * math.pi)
    px, py, pw, ph, pt = (rois[..., None, i] for i in range(5))
    dx_width = pw * dx
    dy_height = ph * dy
    max_ratio = abs(math.log(wh_ratio_clip))
    if add_ctr_clamp:
        dx_width = dx_width.clamp(min=-ctr_clamp, max=ctr_clamp)
        dy_height = dy_height.clamp(min=-ctr_clamp, max=ctr_clamp)
    lower = None if add_ctr_clamp and not regularize else -max_ratio
    dw = dw.clamp(min=lower, max=max_ratio)
    dh = dh.clamp(min=lower, max=max_ratio)
    gw = pw * dw.exp()
    gh = ph * dh.exp()
    if proj_xy:
        gx = dx * pw * torch.cos(pt) - dy * ph * torch.sin(pt) + px
        gy = dx * pw * torch.sin(pt) + dy * ph * torch.cos(pt) + py
    else:
        gx = px + dx_width
        gy = py + dy_height
    gt = norm_angle(pt + dt, angle_version)
    if max_shape is not None:
        gx = gx.clamp(min=0, max=max_shape[1] - 1)
        gy = gy.clamp(min=0, max=max_shape[0] - 1)
    if edge_swap:
        longer = gw > gh
        gt = torch.where(longer, gt, gt + math.pi / 2)
        gw, gh = torch.where(longer, gw, gh), torch.where(longer, gh, gw)
        gt = norm_angle(gt, angle_version)
    if regularize and angle_version == 'oc':
        gw, gh, gt = regularize_oc(gw, gh, gt)
    return torch.stack([gx, gy, gw, gh, gt], dim=-1).view(deltas.size())


@register_shared(TASK_UTILS)
class SafeDeltaXYWHTRBBoxCoder(DeltaXYWHTRBBoxCoder):
    """Drop-in for mmrotate's ``DeltaXYWHTRBBoxCoder`` that stays finite.

    Same arguments, and the same results as upstream wherever upstream's
    are finite (mmrotate's own unit-test values included). It differs:

    - encode replaces a zero or negative proposal or ground-truth width or
      height by ``eps`` before the division and the ``log``, so a
      zero-width box gives a large finite target instead of ``-inf``
      (positive sizes, however small, are kept); it computes in fp32 and
      does not modify the ``gt_bboxes`` object (upstream regularizes it in
      place);
    - decode computes in fp32 and returns fp32 (upstream: the input
      dtype). Nothing else changes unless ``regularize_decode=True``,
      which clamps ``dw``/``dh`` on both sides also under
      ``add_ctr_clamp`` and keeps the 'oc' angle in ``[-pi/2, 0)``
      (w and h swapped where needed: the same box in another
      representation, so the numbers differ from upstream's).

    NaN deltas stay NaN: the coder does not hide them.

    Args:
        target_means (Sequence[float]): Means of the deltas.
            Defaults to (0., 0., 0., 0., 0.).
        target_stds (Sequence[float]): Standard deviations of the deltas.
            Defaults to (1., 1., 1., 1., 1.).
        angle_version (str): 'oc', 'le135' or 'le90'. Defaults to 'oc'.
        norm_factor (float, optional): Angle normalisation factor.
            Defaults to None.
        edge_swap (bool): Swap edges if w < h. Defaults to False.
        proj_xy (bool): Project x and y on the box axes. Defaults to False.
        add_ctr_clamp (bool): Clamp the centre shift. Defaults to False.
        ctr_clamp (int): Maximum centre shift in pixels. Defaults to 32.
        use_box_type (bool): Wrap decoded boxes in ``RotatedBoxes``.
            Defaults to True.
        eps (float): Replaces zero and negative widths and heights in
            encode. Defaults to 1e-6.
        regularize_decode (bool): Bound the decoded boxes (see above).
            Defaults to False.
    """

    def __init__(
        self,
        target_means: Sequence[float] = (0.0, 0.0, 0.0, 0.0, 0.0),
        target_stds: Sequence[float] = (1.0, 1.0, 1.0, 1.0, 1.0),
        angle_version: str = 'oc',
        norm_factor: Optional[float] = None,
        edge_swap: bool = False,
        proj_xy: bool = False,
        add_ctr_clamp: bool = False,
        ctr_clamp: int = 32,
        use_box_type: bool = True,
        eps: float = 1e-6,
        regularize_decode: bool = False,
    ) -> None:
        if angle_version not in ANGLE_VERSIONS:
            raise ValueError(
                'SafeDeltaXYWHTRBBoxCoder: angle_version must '
                f'be one of {ANGLE_VERSIONS}, got '
                f'{angle_version!r}'
            )
        if not eps > 0:
            raise ValueError(
                f'SafeDeltaXYWHTRBBoxCoder: eps must be > 0, got {eps!r}'
            )
        super().__init__(
            target_means=target_means,
            target_stds=target_stds,
            angle_version=angle_version,
            norm_factor=norm_factor,
            edge_swap=edge_swap,
            proj_xy=proj_xy,
            add_ctr_clamp=add_ctr_clamp,
            ctr_clamp=ctr_clamp,
            use_box_type=use_box_type,
        )
        self.eps = eps
        self.regularize_decode = regularize_decode

    def encode(
        self,
        bboxes: Union[RotatedBoxes, Tensor],
        gt_bboxes: Union[RotatedBoxes, Tensor],
    ) -> Tensor:
        """Deltas that turn ``bboxes`` into ``gt_bboxes``.

        Args:
            bboxes (RotatedBoxes | Tensor): Source boxes (N, 5).
            gt_bboxes (RotatedBoxes | Tensor): Targets (N, 5).

        Returns:
            Tensor: Deltas (N, 5), fp32.

        Raises:
            ValueError: If the shapes differ or are not (..., 5).
        """
        bboxes = get_box_tensor(bboxes)
        gt_tensor = get_box_tensor(gt_bboxes)
        if bboxes.shape != gt_tensor.shape or bboxes.size(-1) != 5:
            raise ValueError(
                'SafeDeltaXYWHTRBBoxCoder.encode: bboxes and gt_bboxes must '
                f'both have shape (N, 5), got {tuple(bboxes.shape)} and '
                f'{tuple(gt_tensor.shape)}'
            )
        gts = RotatedBoxes(gt_tensor.float()).regularize_boxes(
            self.angle_version
        )
        return safe_bbox2delta(
            bboxes,
            gts,
            self.means,
            self.stds,
            self.angle_version,
            self.norm_factor,
            self.edge_swap,
            self.proj_xy,
            self.eps,
        )

    def decode(
        self,
        bboxes: Union[RotatedBoxes, Tensor],
        pred_bboxes: Tensor,
        max_shape: Optional[Sequence[int]] = None,
        wh_ratio_clip: float = 16 / 1000,
    ) -> Union[RotatedBoxes, Tensor]:
        """Apply ``pred_bboxes`` to ``bboxes``.

        Args:
            bboxes (RotatedBoxes | Tensor): Base boxes (N, 5) or (B, N, 5).
            pred_bboxes (Tensor): Deltas (N, 5 * k) or (B, N, 5 * k).
            max_shape (Sequence[int], optional): (H, W) bounds.
                Defaults to None.
            wh_ratio_clip (float): Clamp of ``dw``/``dh``.
                Defaults to 16 / 1000.

        Returns:
            RotatedBoxes | Tensor: Decoded boxes, fp32.

        Raises:
            ValueError: If the first dimensions differ.
        """
        if pred_bboxes.size(0) != bboxes.size(0):
            raise ValueError(
                'SafeDeltaXYWHTRBBoxCoder.decode: bboxes and pred_bboxes '
                f'must have the same length, got {bboxes.size(0)} and '
                f'{pred_bboxes.size(0)}'
            )
        decoded = safe_delta2bbox(
            get_box_tensor(bboxes),
            pred_bboxes,
            self.means,
            self.stds,
            max_shape,
            wh_ratio_clip,
            self.add_ctr_clamp,
            self.ctr_clamp,
            self.angle_version,
            self.norm_factor,
            self.edge_swap,
            self.proj_xy,
            self.regularize_decode,
        )
        if self.use_box_type and decoded.size(-1) == 5:
            decoded = RotatedBoxes(decoded)
        return decoded
