# Copyright (c) mmnanguard contributors. All rights reserved.
"""Cases of a CTC loss (``torch.nn.CTCLoss``, or one a toolbox's loss
module holds): ``log_probs`` of 12 frames, 2 samples and 6 classes (more
when the module's blank index is beyond them: mmocr's is its
dictionary's last), the blank being the module's.

CTC gives ``inf`` for a target that needs more frames than the output has
(one per label, plus a blank between two equal labels in a row); with
``zero_infinity=False`` (torch's default) that ``inf`` is the loss. The
cases that plant such a target fail on such a module, which is the NaN
users of CTC recognizers meet (fix: ``zero_infinity=True``, or drop the
labels; ``tools/check_dataset.py`` names them)."""

from typing import List

import torch

from .case import BatteryContext, LossCase, constant_inputs, seeded_randn

#: Frames, samples and classes of the cases.
FRAMES, SAMPLES, CLASSES = 12, 2, 6


def _classes(blank: int) -> int:
    return max(CLASSES, blank + 1)


def _labels(blank: int, count: int, repeat: bool = False) -> List[int]:
    """``count`` labels that are not the blank, all equal when
    ``repeat``."""
    usable = [c for c in range(_classes(blank)) if c != blank][:CLASSES]
    if repeat:
        return [usable[0]] * count
    return [usable[i % len(usable)] for i in range(count)]


def _case(
    name: str,
    group: str,
    ctx: BatteryContext,
    targets: List[List[int]],
    scale: float = 1.0,
) -> LossCase:
    logits = seeded_randn(FRAMES, SAMPLES, _classes(ctx.blank)) * scale
    flat = torch.tensor([label for t in targets for label in t])
    return LossCase(
        name,
        group,
        constant_inputs(
            logits.log_softmax(-1),
            flat,
            torch.full((SAMPLES,), FRAMES),
            torch.tensor([len(t) for t in targets]),
        ),
    )


def ctc_cases(ctx: BatteryContext) -> List[LossCase]:
    """The CTC cases; ``ctx.blank`` is the module's blank index."""
    blank = ctx.blank
    fits = _labels(blank, 4)
    return [
        _case('aligned targets', 'nominal', ctx, [fits, _labels(blank, 3)]),
        _case('an empty target', 'empty', ctx, [fits, []]),
        _case('extreme logits (x1e4)', 'predictions', ctx, [fits, fits], 1e4),
        _case(
            f'a target longer than the {FRAMES} output frames',
            'labels',
            ctx,
            [fits, _labels(blank, FRAMES + 2)],
        ),
        _case(
            f'{FRAMES // 2 + 1} equal labels (need {FRAMES + 1} frames '
            f'with the blanks between them)',
            'labels',
            ctx,
            [fits, _labels(blank, FRAMES // 2 + 1, repeat=True)],
        ),
    ]
