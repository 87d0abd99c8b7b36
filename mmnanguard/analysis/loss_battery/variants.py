# Copyright (c) mmnanguard contributors. All rights reserved.
"""Cases that every input kind shares: precision and weight variants of
its nominal input, and ``avg_factor=0``."""

from typing import Callable, List

import torch

from .case import Inputs, LossCase


def _with_kwargs(make: Callable[[], Inputs], **extra) -> Callable[[], Inputs]:
    """``make`` with ``extra`` keyword inputs added."""

    def wrapped() -> Inputs:
        args, kwargs = make()
        kwargs.update(extra)
        return args, kwargs

    return wrapped


def shared_variants(
    nominal: Callable[[], Inputs], extreme: Callable[[], Inputs], label: str
) -> List[LossCase]:
    """The precision, weight and ``avg_factor`` cases of a kind.

    Args:
        nominal (Callable): ``make`` of the kind's nominal input.
        extreme (Callable): ``make`` of its most extreme input that fp16
            still represents (max 65504: logits of ±1e4, boxes of 1e4 px).
        label (str): What ``extreme`` is, for the case names.

    Returns:
        list[LossCase]: fp16 and bf16 under CPU autocast (nominal and
        extreme), ``loss_weight`` 0 and 10, reductions 'none' and 'sum',
        and ``avg_factor=0``.
    """
    cases = [
        LossCase('avg_factor=0', 'empty', _with_kwargs(nominal, avg_factor=0))
    ]
    for dtype, name in ((torch.float16, 'fp16'), (torch.bfloat16, 'bf16')):
        cases += [
            LossCase(
                f'{name} autocast', 'precision', nominal, precision=dtype
            ),
            LossCase(f'{name} autocast, {label}', 'precision', extreme, dtype),
        ]
    cases += [
        LossCase('loss_weight=0', 'weights', nominal, loss_weight=0.0),
        LossCase('loss_weight=10', 'weights', nominal, loss_weight=10.0),
        LossCase(
            "reduction 'none'",
            'weights',
            _with_kwargs(nominal, reduction_override='none'),
        ),
        LossCase(
            "reduction 'sum'",
            'weights',
            _with_kwargs(nominal, reduction_override='sum'),
        ),
    ]
    return cases
