# Copyright (c) mmnanguard contributors. All rights reserved.
"""Differentiable IoU of rotated boxes in plain PyTorch, with finite
gradients.

The algorithm is mmcv's ``diff_iou_rotated_2d`` (after lilanxiao's
Rotated_IoU): the intersection polygon is made of the corners of each box
that lie inside the other and of the edge-edge intersections; its vertices
are sorted by angle around their mean and the shoelace formula gives the
area. Differences:

- the vertex sort is ``torch.sort`` (mmcv 2.0.1 has a CUDA kernel only, so
  ``mmrotate.RotatedIoULoss`` cannot run on the CPU);
- every division has a safe denominator *before* it is taken, instead of
  masking its result afterwards (``torch.where`` on the result leaves
  ``0 * inf = nan`` in the backward pass): edge pairs with
  ``cross(d1, d2) ** 2 <= 1e-12 |d1|^2 |d2|^2 + 1e-24`` count as parallel
  (no intersection point), and the intersection parameter of a rejected
  pair is replaced by 0 before it is used;
- a corner counts as inside a box if it lies within a distance of
  ``1e-5 (|ab| + |ad|)`` of it (relative to the box size, not to one
  edge: fp32 rounding on elongated boxes exceeds mmcv's tolerance of
  ``1e-6`` of the edge), and a box of zero area contains no corner;
- both boxes are shifted to the target's centre first (less rounding);
- the union is clamped to at least ``union_eps`` before the division.
"""

import torch
from torch import Tensor

_PARALLEL_REL = 1e-12
_PARALLEL_ABS = 1e-24
_INSIDE_TOL = 1e-5
# Sort key of vertices that are not part of the polygon (> pi).
_INVALID_KEY = 10.0


def box2corners(boxes: Tensor) -> Tensor:
    """Corners of rotated boxes.

    Args:
        boxes (Tensor): (N, 5) as (cx, cy, w, h, angle).

    Returns:
        Tensor: (N, 4, 2) corners, counter-clockwise for positive w and h.
    """
    x, y, w, h, a = boxes.unbind(dim=-1)
    cos, sin = torch.cos(a), torch.sin(a)
    sx = boxes.new_tensor([0.5, -0.5, -0.5, 0.5])
    sy = boxes.new_tensor([0.5, 0.5, -0.5, -0.5])
    lx = sx * w[:, None]
    ly = sy * h[:, None]
    cx = x[:, None] + lx * cos[:, None] - ly * sin[:, None]
    cy = y[:, None] + lx * sin[:, None] + ly * cos[:, None]
    return torch.stack([cx, cy], dim=-1)


def _edge_intersections(c1: Tensor, c2: Tensor):
    """Intersections of each edge of box 1 with each edge of box 2.

    Returns:
        tuple[Tensor, Tensor]: Points (N, 16, 2) (meaningless where
        invalid) and their mask (N, 16).
    """
    p1 = c1.unsqueeze(2)  # (N, 4, 1, 2) edge starts of box 1
    p2 = c1.roll(-1, dims=1).unsqueeze(2)
    p3 = c2.unsqueeze(1)  # (N, 1, 4, 2) edge starts of box 2
    p4 = c2.roll(-1, dims=1).unsqueeze(1)
    d1 = p2 - p1
    d2 = p4 - p3
    d13 = p3 - p1
    # p1 + t d1 = p3 + u d2
    num = d1[..., 0] * d2[..., 1] - d1[..., 1] * d2[..., 0]
    t_num = d13[..., 0] * d2[..., 1] - d13[..., 1] * d2[..., 0]
    u_num = d13[..., 0] * d1[..., 1] - d13[..., 1] * d1[..., 0]
    with torch.no_grad():
        len1 = d1[..., 0] * d1[..., 0] + d1[..., 1] * d1[..., 1]
        len2 = d2[..., 0] * d2[..., 0] + d2[..., 1] * d2[..., 1]
        nonpar = num * num > _PARALLEL_REL * len1 * len2 + _PARALLEL_ABS
    num_safe = torch.where(nonpar, num, torch.ones_like(num))
    t = t_num / num_safe
    u = u_num / num_safe
    mask = nonpar & (t > 0) & (t < 1) & (u > 0) & (u < 1)
    # t of a rejected pair is replaced before use; its point is then p1,
    # and the caller zeroes every vertex outside the mask
    t = torch.where(mask, t, torch.zeros_like(t))
    points = p1 + t.unsqueeze(-1) * d1
    return points.flatten(1, 2), mask.flatten(1, 2)


def _corners_inside(corners: Tensor, box_corners: Tensor) -> Tensor:
    """Whether each corner lies in the box (edges included, zero-area boxes
    contain nothing).

    Args:
        corners (Tensor): (N, 4, 2) points.
        box_corners (Tensor): (N, 4, 2) corners of the containing boxes.

    Returns:
        Tensor: (N, 4) bool.
    """
    with torch.no_grad():
        a = box_corners[:, 0:1]
        ab = box_corners[:, 1:2] - a
        ad = box_corners[:, 3:4] - a
        am = corners - a
        prod_ab = ab[..., 0] * am[..., 0] + ab[..., 1] * am[..., 1]
        prod_ad = ad[..., 0] * am[..., 0] + ad[..., 1] * am[..., 1]
        norm_ab = ab[..., 0] * ab[..., 0] + ab[..., 1] * ab[..., 1]
        norm_ad = ad[..., 0] * ad[..., 0] + ad[..., 1] * ad[..., 1]
        len_ab, len_ad = norm_ab.sqrt(), norm_ad.sqrt()
        # tolerance on the distance to each edge: 1e-5 of the box size
        tol = _INSIDE_TOL * (len_ab + len_ad)
        inside_ab = (prod_ab >= -tol * len_ab) & (
            prod_ab <= norm_ab + tol * len_ab
        )
        inside_ad = (prod_ad >= -tol * len_ad) & (
            prod_ad <= norm_ad + tol * len_ad
        )
        return inside_ab & inside_ad & (norm_ab > 0) & (norm_ad > 0)


def intersection_area(c1: Tensor, c2: Tensor) -> Tensor:
    """Area of the intersection of two convex quadrilaterals per row.

    Args:
        c1 (Tensor): (N, 4, 2) corners.
        c2 (Tensor): (N, 4, 2) corners.

    Returns:
        Tensor: (N, ) areas.
    """
    points, mask_int = _edge_intersections(c1, c2)
    vertices = torch.cat([c1, c2, points], dim=1)  # (N, 24, 2)
    mask = torch.cat(
        [_corners_inside(c1, c2), _corners_inside(c2, c1), mask_int], dim=1
    )
    with torch.no_grad():
        maskf = mask.to(vertices.dtype).unsqueeze(-1)
        num_valid = mask.sum(1)
        mean = (vertices * maskf).sum(1, keepdim=True) / num_valid.clamp(
            min=1
        ).view(-1, 1, 1).to(vertices.dtype)
        rel = vertices - mean
        # pseudo-angle, monotone in atan2(y, x), in [-2, 2): cheaper
        rx, ry = rel[..., 0], rel[..., 1]
        frac = rx / (rx.abs() + ry.abs()).clamp(min=1e-30)
        key = torch.where(ry >= 0, 1 - frac, frac - 1)
        key = torch.where(mask, key, torch.full_like(key, _INVALID_KEY))
        order = key.argsort(dim=1)
        index = torch.arange(order.size(1), device=order.device)
        nxt = torch.where(
            index[None] + 1 < num_valid[:, None],
            index[None] + 1,
            torch.zeros_like(order),
        )
    # Centre on the (constant) mean: same area, less cancellation.
    centred = torch.where(
        mask.unsqueeze(-1), vertices - mean, torch.zeros_like(vertices)
    )
    ordered = torch.gather(centred, 1, order.unsqueeze(-1).expand(-1, -1, 2))
    following = torch.gather(ordered, 1, nxt.unsqueeze(-1).expand(-1, -1, 2))
    cross = (
        ordered[..., 0] * following[..., 1]
        - ordered[..., 1] * following[..., 0]
    )
    return cross.sum(1).abs() / 2


def diff_rotated_iou(
    pred: Tensor, target: Tensor, union_eps: float = 1e-6
) -> Tensor:
    """Differentiable IoU of aligned pairs of rotated boxes.

    Computed in ``pred``'s dtype promoted to at least fp32 (float64 stays
    float64).

    Args:
        pred (Tensor): (N, 5) boxes (cx, cy, w, h, angle).
        target (Tensor): (N, 5) boxes.
        union_eps (float): Lower bound of the union area before the
            division. Defaults to 1e-6.

    Returns:
        Tensor: (N, ) IoU in ``[0, 1]`` up to rounding; 0 where both boxes
        have zero area.
    """
    dtype = torch.promote_types(pred.dtype, torch.float32)
    pred = pred.to(dtype)
    target = target.to(dtype)
    if pred.numel() == 0:  # keep the (empty) graph connected
        return pred[:, 0] * 0
    # IoU is translation invariant: centre both on the target, so that the
    # corners carry no large offset into the rounding.
    origin = target[:, :2].detach()
    shift = torch.cat([origin, origin.new_zeros(origin.size(0), 3)], dim=1)
    inter = intersection_area(
        box2corners(pred - shift), box2corners(target - shift)
    )
    area1 = pred[:, 2].clamp(min=0) * pred[:, 3].clamp(min=0)
    area2 = target[:, 2].clamp(min=0) * target[:, 3].clamp(min=0)
    union = (area1 + area2 - inter).clamp(min=union_eps)
    return inter / union
