# Copyright (c) mmnanguard contributors. All rights reserved.
"""Battery of an angle loss: predicted and target angles (N, 1) in
radians, on and across the boundary of the angle version."""

import math
from typing import List

import torch

from .boxes import ANGLE_RANGES
from .case import BatteryContext, LossCase, constant_inputs, seeded_randn
from .variants import shared_variants

_N = 6


def angle_cases(ctx: BatteryContext) -> List[LossCase]:
    """The cases of an angle loss.

    Args:
        ctx (BatteryContext): ``angle_version``.

    Returns:
        list[LossCase]: See :data:`~.case.GROUPS`.
    """
    low, high = ANGLE_RANGES.get(ctx.angle_version, ANGLE_RANGES['le90'])
    target = 0.5 * seeded_randn(_N, 1)
    nominal = constant_inputs(
        target + 0.1 * seeded_randn(_N, 1, seed=1), target
    )
    extreme = constant_inputs(target + 1e4, target)
    ones = torch.ones(_N, 1)
    return [
        LossCase('nominal', 'nominal', nominal),
        LossCase(
            'zero instances',
            'empty',
            constant_inputs(torch.zeros(0, 1), torch.zeros(0, 1)),
        ),
        LossCase(
            'all-zero predictions',
            'predictions',
            constant_inputs(torch.zeros(_N, 1), target),
        ),
        LossCase(
            'prediction identical to target',
            'predictions',
            constant_inputs(target, target),
        ),
        LossCase('angles 1e4 rad off', 'predictions', extreme),
        LossCase(
            f'angles on the {ctx.angle_version} boundary '
            f'({low:.4g} vs {high:.4g})',
            'degenerate boxes',
            constant_inputs(low * ones, (high - 1e-6) * ones),
        ),
        LossCase(
            'angles a half turn apart',
            'degenerate boxes',
            constant_inputs(0 * ones, math.pi * ones),
        ),
    ] + shared_variants(nominal, extreme, 'angles 1e4 rad off')
