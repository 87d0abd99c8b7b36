# Copyright (c) mmnanguard contributors. All rights reserved.
"""Battery of box regression losses: horizontal boxes (N, 4) ``xyxy``,
rotated boxes (N, 5) ``xywha`` (also the input of the Gaussian losses),
and quadrilaterals (N, 8) against 9 predicted points (N, 18)."""

import math
from typing import Callable, List

import torch
from torch import Tensor

from .case import BatteryContext, LossCase, constant_inputs, seeded_randn
from .variants import shared_variants

_N = 4
#: Angle range of each mmrotate angle version: [low, high).
ANGLE_RANGES = {
    'oc': (0.0, math.pi / 2),
    'le90': (-math.pi / 2, math.pi / 2),
    'le135': (-math.pi / 4, 3 * math.pi / 4),
}


def _rotated_target() -> Tensor:
    """Reproducible rotated boxes (N, 5): 10-30 px, centres 100-200."""
    u = seeded_randn(_N, 5, seed=1).abs()
    return torch.stack(
        (
            100 + 50 * u[:, 0],
            100 + 50 * u[:, 1],
            10 + 20 * u[:, 2],
            10 + 20 * u[:, 3],
            0.25 * seeded_randn(_N, seed=2),
        ),
        dim=1,
    )


def _noise(shape, scale: float) -> Tensor:
    """Reproducible normal noise of ``scale``."""
    return scale * seeded_randn(*shape, seed=3)


def _set(boxes: Tensor, col: int, value: float) -> Tensor:
    """A copy of ``boxes`` with column ``col`` set to ``value``."""
    boxes = boxes.clone()
    boxes[:, col] = value
    return boxes


def _degenerate_cases(
    pred_of: Callable[[Tensor], Tensor],
    target_of: Callable[[Tensor], Tensor],
    rot: Tensor,
) -> List[LossCase]:
    """Cases shared by the three box kinds, written on rotated boxes and
    converted by ``pred_of`` / ``target_of``."""
    noisy = rot + _noise(rot.shape, 0.5)
    huge_aspect = _set(_set(rot, 2, 1e4), 3, 1e-2)
    thin_w, thin_h = _set(rot, 2, 0.0), _set(rot, 3, 0.0)
    point = _set(thin_w, 3, 0.0)
    big = rot * torch.tensor([1e4, 1e4, 5e4, 5e4, 1.0])

    def case(name: str, pred: Tensor, target: Tensor, group: str):
        return LossCase(
            name, group, constant_inputs(pred_of(pred), target_of(target))
        )

    return [
        case('zero-width target box', noisy, thin_w, 'degenerate boxes'),
        case('zero-height target box', noisy, thin_h, 'degenerate boxes'),
        case('zero-width predicted box', thin_w, rot, 'degenerate boxes'),
        case(
            'zero-area prediction and target', point, point, 'degenerate boxes'
        ),
        case(
            'aspect ratio 1e6 (1e4 x 1e-2)',
            huge_aspect + _noise(rot.shape, 1e-3),
            huge_aspect,
            'degenerate boxes',
        ),
        case(
            'boxes of 1e6 px',
            big + _noise(rot.shape, 10.0),
            big,
            'degenerate boxes',
        ),
        case('all-zero predictions', rot * 0, rot, 'predictions'),
        case('prediction identical to target', rot, rot, 'predictions'),
    ]


def _box_cases(
    pred_of: Callable[[Tensor], Tensor],
    target_of: Callable[[Tensor], Tensor],
    rot: Tensor,
    empty_dims: tuple,
) -> List[LossCase]:
    """Every case of a box kind; ``empty_dims`` are the widths of the
    empty prediction and target."""
    nominal = constant_inputs(
        pred_of(rot + _noise(rot.shape, 0.5)), target_of(rot)
    )
    # fp16 represents at most 65504: boxes of about 1e4 px
    big = rot * torch.tensor([1e2, 1e2, 5e2, 5e2, 1.0])
    extreme = constant_inputs(
        pred_of(big + _noise(rot.shape, 1.0)), target_of(big)
    )
    empty_pred, empty_target = empty_dims
    cases = [
        LossCase('nominal', 'nominal', nominal),
        LossCase(
            'zero instances',
            'empty',
            constant_inputs(
                torch.zeros(0, empty_pred), torch.zeros(0, empty_target)
            ),
        ),
        LossCase(
            'zero instances, avg_factor=0',
            'empty',
            constant_inputs(
                torch.zeros(0, empty_pred),
                torch.zeros(0, empty_target),
                avg_factor=0,
            ),
        ),
    ]
    cases += _degenerate_cases(pred_of, target_of, rot)
    return cases + shared_variants(nominal, extreme, 'boxes of 1e4 px')


def rotated_to_xyxy(rot: Tensor) -> Tensor:
    """Axis-aligned ``xyxy`` boxes with the centres and sizes of ``rot``."""
    cx, cy, w, h = rot[:, 0], rot[:, 1], rot[:, 2], rot[:, 3]
    return torch.stack((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2), 1)


def rotated_corners(rot: Tensor) -> Tensor:
    """The 4 corners (N, 8) of rotated boxes ``xywha``."""
    cx, cy, w, h, a = rot.unbind(1)
    cos, sin = torch.cos(a), torch.sin(a)
    corners = []
    for sx, sy in ((-1, -1), (1, -1), (1, 1), (-1, 1)):
        dx, dy = sx * w / 2, sy * h / 2
        corners += [cx + dx * cos - dy * sin, cy + dx * sin + dy * cos]
    return torch.stack(corners, 1)


def rotated_points(rot: Tensor) -> Tensor:
    """9 points (N, 18) of rotated boxes: corners, edge midpoints, centre."""
    c = rotated_corners(rot).view(-1, 4, 2)
    mids = (c + c.roll(-1, dims=1)) / 2
    centre = c.mean(1, keepdim=True)
    return torch.cat((c, mids, centre), 1).reshape(-1, 18)


def box_cases(ctx: BatteryContext) -> List[LossCase]:
    """Cases of a horizontal box loss (``xyxy`` boxes, (N, 4))."""
    return _box_cases(
        rotated_to_xyxy, rotated_to_xyxy, _rotated_target(), (4, 4)
    )


def rotated_box_cases(ctx: BatteryContext) -> List[LossCase]:
    """Cases of a rotated box loss (``xywha``, (N, 5)), with angles on the
    boundary of ``ctx.angle_version``."""
    rot = _rotated_target()
    keep = lambda boxes: boxes  # noqa: E731
    cases = _box_cases(keep, keep, rot, (5, 5))
    low, high = ANGLE_RANGES.get(ctx.angle_version, ANGLE_RANGES['le90'])
    square = rot[:, [0, 1, 2, 2, 4]]
    cases.append(
        LossCase(
            f'angles on the {ctx.angle_version} boundary '
            f'({low:.4g} vs {high:.4g})',
            'degenerate boxes',
            constant_inputs(_set(rot, 4, low), _set(rot, 4, high - 1e-6)),
        )
    )
    cases.append(
        LossCase(
            'square boxes, angles a quarter turn apart',
            'degenerate boxes',
            constant_inputs(
                _set(square, 4, 0.0), _set(square, 4, math.pi / 2)
            ),
        )
    )
    return cases


def quad_cases(ctx: BatteryContext) -> List[LossCase]:
    """Cases of a quadrilateral loss: 9 predicted points (N, 18) against
    target corners (N, 8)."""
    return _box_cases(
        rotated_points, rotated_corners, _rotated_target(), (18, 8)
    )
