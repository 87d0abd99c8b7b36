# Copyright (c) mmnanguard contributors. All rights reserved.
"""Battery of a classification loss: scores (N, C) and class indices (N, )
(``C`` is the background of sigmoid losses)."""

from typing import List

import torch
from torch import Tensor

from .case import BatteryContext, LossCase, constant_inputs, seeded_randn
from .variants import shared_variants

_N = 6


def _scores(logits: Tensor, ctx: BatteryContext) -> Tensor:
    """Logits, or their sigmoid for a loss that takes probabilities."""
    return logits.sigmoid() if ctx.takes_probabilities else logits


def classification_cases(ctx: BatteryContext) -> List[LossCase]:
    """The cases of a classification loss.

    Args:
        ctx (BatteryContext): ``num_classes``, ``use_sigmoid``,
            ``takes_probabilities``.

    Returns:
        list[LossCase]: See :data:`~.case.GROUPS`.
    """
    c = ctx.num_classes
    labels = torch.arange(_N) % (c + 1 if ctx.use_sigmoid else c)
    hot = torch.zeros(_N, c)
    fg = labels < c
    hot[fg.nonzero()[:, 0], labels[fg]] = 1.0
    sign = torch.where(seeded_randn(_N, c) > 0, 1.0, -1.0)
    nominal = constant_inputs(_scores(seeded_randn(_N, c), ctx), labels)
    extreme = constant_inputs(_scores(1e4 * sign, ctx), labels)
    if ctx.takes_probabilities:
        exact = (sign > 0).float()
    else:  # sigmoid(±200) is exactly 1 and 0 in fp32
        exact = 200.0 * sign
    cases = [
        LossCase('nominal', 'nominal', nominal),
        LossCase(
            'no targets (0 samples)',
            'empty',
            constant_inputs(torch.zeros(0, c), labels[:0]),
        ),
        LossCase(
            '0 samples, avg_factor=0',
            'empty',
            constant_inputs(torch.zeros(0, c), labels[:0], avg_factor=0),
        ),
        LossCase(
            'all-zero predictions',
            'predictions',
            constant_inputs(_scores(torch.zeros(_N, c), ctx), labels),
        ),
        LossCase(
            'probabilities exactly 0 and 1',
            'predictions',
            constant_inputs(exact, labels),
        ),
        LossCase(
            'logits ±1e2',
            'predictions',
            constant_inputs(_scores(1e2 * sign, ctx), labels),
        ),
        LossCase('logits ±1e4', 'predictions', extreme),
        LossCase(
            'prediction identical to target',
            'predictions',
            constant_inputs(_scores(1e4 * (2 * hot - 1), ctx), labels),
        ),
        LossCase(
            'confidently wrong (logits ∓1e4)',
            'predictions',
            constant_inputs(_scores(-1e4 * (2 * hot - 1), ctx), labels),
        ),
        LossCase(
            f'labels = num_classes ({c})',
            'labels',
            constant_inputs(_scores(seeded_randn(_N, c), ctx), labels * 0 + c),
            refusal_ok=True,
        ),
        LossCase(
            'labels = 255',
            'labels',
            constant_inputs(
                _scores(seeded_randn(_N, c), ctx), labels * 0 + 255
            ),
            refusal_ok=True,
        ),
    ]
    cases += shared_variants(nominal, extreme, 'logits ±1e4')
    if ctx.quality_targets:
        for case in cases:
            case.make = _with_quality(case.make)
    if ctx.one_hot_targets:
        cases = [c for c in cases if c.group != 'labels']
        for case in cases:
            case.make = _with_one_hot(case.make, c)
    return cases


def _with_one_hot(make, num_classes: int):
    """Targets one-hot (N, C); the background label ``C`` is a zero row."""

    def wrapped():
        (pred, labels), kwargs = make()
        hot = torch.zeros(labels.numel(), num_classes)
        fg = labels < num_classes
        hot[fg.nonzero()[:, 0], labels[fg]] = 1.0
        return [pred, hot], kwargs

    return wrapped


def _with_quality(make):
    """Targets ``(labels, scores)``: an IoU score of 0.5 per sample."""

    def wrapped():
        (pred, labels), kwargs = make()
        return [pred, (labels, torch.full(labels.shape, 0.5))], kwargs

    return wrapped
