# Copyright (c) mmnanguard contributors. All rights reserved.
"""Battery of a distribution loss (GFL's ``DistributionFocalLoss``): logits
over the bins ``0..n`` (N, n+1) and float distances (N, ) in ``[0, n)``,
the form GFL's and YOLOv8's heads feed it (their coders clamp the
distances below ``n``)."""

from typing import List

import torch

from .case import BatteryContext, LossCase, constant_inputs, seeded_randn
from .variants import shared_variants

_N = 6
#: Bins of GFL's and YOLOv8's heads (``reg_max=16``).
_BINS = 16


def _on_bins(bins: torch.Tensor, scale: float) -> torch.Tensor:
    """Logits ``+scale`` on the given bin of each row, ``-scale`` on the
    others."""
    logits = torch.full((bins.numel(), _BINS + 1), -scale)
    logits[torch.arange(bins.numel()), bins] = scale
    return logits


def distribution_cases(ctx: BatteryContext) -> List[LossCase]:
    """The cases of a distribution loss.

    Args:
        ctx (BatteryContext): Unused (the bins are GFL's 16).

    Returns:
        list[LossCase]: See :data:`~.case.GROUPS`; a distance of exactly
        ``n`` (its right bin ``n+1`` does not exist) may be refused.
    """
    n = _BINS
    target = torch.tensor([0.5, 3.25, 7.0, 11.8, 15.5, 2.0])
    logits = seeded_randn(_N, n + 1)
    sign = torch.where(logits > 0, 1.0, -1.0)
    nominal = constant_inputs(logits, target)
    extreme = constant_inputs(1e4 * sign, target)
    whole = target.floor().long()
    far = torch.where(whole < n // 2, n, 0)
    cases = [
        LossCase('nominal', 'nominal', nominal),
        LossCase(
            'zero instances',
            'empty',
            constant_inputs(torch.zeros(0, n + 1), target[:0]),
        ),
        LossCase(
            'zero instances, avg_factor=0',
            'empty',
            constant_inputs(torch.zeros(0, n + 1), target[:0], avg_factor=0),
        ),
        LossCase(
            'all-zero predictions (uniform)',
            'predictions',
            constant_inputs(torch.zeros(_N, n + 1), target),
        ),
        LossCase('logits ±1e4', 'predictions', extreme),
        LossCase(
            'prediction identical to target (whole distances)',
            'predictions',
            constant_inputs(_on_bins(whole, 1e4), whole.float()),
        ),
        LossCase(
            'confidently wrong (1e4 on the farthest bin)',
            'predictions',
            constant_inputs(_on_bins(far, 1e4), target),
        ),
        LossCase(
            f'distances on the edges (0 and {n - 0.1:g})',
            'labels',
            constant_inputs(logits, torch.tensor([0.0, n - 0.1] * (_N // 2))),
        ),
        LossCase(
            f'distance = n ({n}, no bin n+1)',
            'labels',
            constant_inputs(logits, torch.full((_N,), float(n))),
            refusal_ok=True,
        ),
    ]
    return cases + shared_variants(nominal, extreme, 'logits ±1e4')
