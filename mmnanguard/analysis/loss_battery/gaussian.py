# Copyright (c) mmnanguard contributors. All rights reserved.
"""Battery of a Gaussian (GWD / KLD / JD) loss: rotated boxes ``xywha``
turned into 2-D Gaussians by the loss, so the rotated box cases plus the
ones that stress the covariance and the centre distance."""

from typing import List

from .boxes import rotated_box_cases
from .case import BatteryContext, LossCase, constant_inputs


def gaussian_cases(ctx: BatteryContext) -> List[LossCase]:
    """The cases of a Gaussian distance loss.

    Args:
        ctx (BatteryContext): ``angle_version``.

    Returns:
        list[LossCase]: The rotated box cases, then centres 1e6 px apart
        and a thin box against a square one of the same centre.
    """
    cases = rotated_box_cases(ctx)
    nominal = next(c for c in cases if c.name == 'nominal')
    (pred, target), _ = nominal.make()
    far = pred.detach().clone()
    far[:, :2] += 1e6
    thin = target.clone()
    thin[:, 3] = 1e-3
    square = target[:, [0, 1, 2, 2, 4]]
    return cases + [
        LossCase(
            'centres 1e6 px apart',
            'degenerate boxes',
            constant_inputs(far, target),
        ),
        LossCase(
            'thin prediction (h=1e-3) on a square target',
            'degenerate boxes',
            constant_inputs(thin, square),
        ),
    ]
