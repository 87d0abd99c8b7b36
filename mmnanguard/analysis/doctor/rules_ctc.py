# Copyright (c) mmnanguard contributors. All rights reserved.
"""CTC losses that turn an impossible alignment into ``inf``.

``torch.nn.CTCLoss`` gives ``inf`` for a sample whose target cannot be
aligned to its output frames (a text label longer than the recognizer's
output sequence, or repeated characters that need a blank frame between
them). With ``zero_infinity=False`` (torch's default, and what mmocr's
``CTCModuleLoss`` passes by default) that ``inf`` reaches the loss and its
gradient. The rule reads the built model: every ``nn.CTCLoss`` module in
it, wherever a toolbox put it.
"""

from typing import List

import torch.nn as nn

from .context import DoctorContext
from .finding import Finding


def check_ctc_zero_infinity(ctx: DoctorContext) -> List[Finding]:
    """Every built ``nn.CTCLoss`` with ``zero_infinity=False``."""
    model = ctx.built_model
    if model is None:
        return [
            Finding(
                'model-not-built',
                'info',
                'the model does not build on the meta device '
                f'({ctx.model_build_error}): the rules that read the built '
                'model (its CTC losses; BatchNorm that the config does not '
                'write) did not run',
                'none: this says what was not checked',
            )
        ]
    found = [
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.CTCLoss) and not module.zero_infinity
    ]
    if not found:
        return []
    owner = found[0].rpartition('.')[0]
    return [
        Finding(
            'ctc-zero-infinity',
            'warning',
            f'{len(found)} CTCLoss module(s) with zero_infinity=False '
            f"({', '.join(f'model.{n}' for n in found)}): a sample whose "
            'text is longer than the output sequence (or whose repeated '
            'characters need more frames than there are) has an infinite '
            'CTC loss, and its gradient is non-finite',
            f'model.{owner}.zero_infinity=True  # or drop labels longer '
            'than the output length',
            f'model.{found[0]}',
        )
    ]
