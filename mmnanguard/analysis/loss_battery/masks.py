# Copyright (c) mmnanguard contributors. All rights reserved.
"""Battery of mask losses (mask/dice: per-instance mask logits (N, H, W)
against binary masks) and of segmentation losses (logits (N, C, H, W)
against label maps (N, H, W) with ``ignore_index``)."""

from typing import List

import torch
from torch import Tensor

from .case import BatteryContext, LossCase, constant_inputs, seeded_randn
from .variants import shared_variants

_N, _H, _W = 2, 8, 8


def _activated(logits: Tensor, ctx: BatteryContext) -> Tensor:
    """Logits, or their sigmoid for a loss that takes probabilities."""
    return logits.sigmoid() if ctx.takes_probabilities else logits


def mask_cases(ctx: BatteryContext) -> List[LossCase]:
    """The cases of a mask (e.g. Dice) loss.

    Args:
        ctx (BatteryContext): ``takes_probabilities``.

    Returns:
        list[LossCase]: See :data:`~.case.GROUPS`.
    """
    target = (seeded_randn(_N, _H, _W, seed=1) > 0).float()
    sign = 2 * target - 1
    nominal = constant_inputs(
        _activated(seeded_randn(_N, _H, _W), ctx), target
    )
    extreme = constant_inputs(_activated(-1e4 * sign, ctx), target)
    exact = target if ctx.takes_probabilities else 200.0 * sign
    zeros = torch.zeros(_N, _H, _W)
    return [
        LossCase('nominal', 'nominal', nominal),
        LossCase(
            'zero instances',
            'empty',
            constant_inputs(torch.zeros(0, _H, _W), torch.zeros(0, _H, _W)),
        ),
        LossCase(
            'empty ground-truth masks',
            'empty',
            constant_inputs(_activated(seeded_randn(_N, _H, _W), ctx), zeros),
        ),
        LossCase(
            'all-zero predictions',
            'predictions',
            constant_inputs(_activated(zeros, ctx), target),
        ),
        LossCase(
            'all-zero predictions, empty masks',
            'predictions',
            constant_inputs(zeros, zeros),
        ),
        LossCase(
            'probabilities exactly 0 and 1',
            'predictions',
            constant_inputs(exact, target),
        ),
        LossCase(
            'probabilities exactly 0, empty masks',
            'predictions',
            constant_inputs(
                zeros if ctx.takes_probabilities else zeros - 200, zeros
            ),
        ),
        LossCase(
            'logits ±1e2',
            'predictions',
            constant_inputs(_activated(1e2 * sign, ctx), target),
        ),
        LossCase('confidently wrong (logits ∓1e4)', 'predictions', extreme),
        LossCase(
            'prediction identical to target',
            'predictions',
            constant_inputs(
                target if ctx.takes_probabilities else 1e4 * sign, target
            ),
        ),
    ] + shared_variants(nominal, extreme, 'logits ∓1e4')


def segmentation_cases(ctx: BatteryContext) -> List[LossCase]:
    """The cases of a segmentation loss. The label map cases pass
    ``ignore_index=ctx.ignore_index`` as a decode head does.

    Args:
        ctx (BatteryContext): ``num_classes``, ``ignore_index``.

    Returns:
        list[LossCase]: See :data:`~.case.GROUPS`.
    """
    c, ignore = ctx.num_classes, ctx.ignore_index
    labels = (seeded_randn(_N, _H, _W, seed=1).abs() * c).long() % c
    labels[:, :2, :2] = ignore
    hot = torch.nn.functional.one_hot(labels.clamp(max=c - 1), c)
    hot = hot.permute(0, 3, 1, 2).float()
    logits = seeded_randn(_N, c, _H, _W)
    nominal = constant_inputs(logits, labels, ignore_index=ignore)
    extreme = constant_inputs(
        -1e4 * (2 * hot - 1), labels, ignore_index=ignore
    )

    def case(name: str, group: str, pred: Tensor, lab: Tensor, **kw):
        refusal_ok = kw.pop('refusal_ok', False)
        return LossCase(
            name,
            group,
            constant_inputs(pred, lab, **kw),
            refusal_ok=refusal_ok,
        )

    return [
        LossCase('nominal', 'nominal', nominal),
        case(
            'zero images',
            'empty',
            logits[:0],
            labels[:0],
            ignore_index=ignore,
        ),
        case(
            f'all-ignore label map ({ignore})',
            'labels',
            logits,
            labels * 0 + ignore,
            ignore_index=ignore,
        ),
        case(
            f'labels = num_classes ({c})',
            'labels',
            logits,
            labels * 0 + c,
            ignore_index=ignore,
            refusal_ok=True,
        ),
        case(
            'labels 255, loss default ignore_index',
            'labels',
            logits,
            torch.where(labels == ignore, 255, labels),
            refusal_ok=True,
        ),
        case(
            'all-zero logits',
            'predictions',
            torch.zeros_like(logits),
            labels,
            ignore_index=ignore,
        ),
        case(
            'logits ±1e4, prediction identical to target',
            'predictions',
            1e4 * (2 * hot - 1),
            labels,
            ignore_index=ignore,
        ),
        LossCase('confidently wrong (logits ∓1e4)', 'predictions', extreme),
    ] + shared_variants(nominal, extreme, 'logits ∓1e4')
