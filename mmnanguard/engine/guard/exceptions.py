# Copyright (c) mmnanguard contributors. All rights reserved.
"""Named exceptions raised by the guard, and the exceptions of numerical
routines that data can trigger."""

import traceback

import numpy as np
import torch

from ..incident import Stage

#: Raised by numerical routines on degenerate input (a singular matrix
#: from a box of width 0): handled as data faults when the batch's data
#: checks fail (:mod:`mmnanguard.engine.hooks.numerical_errors`).
NUMERICAL_ERRORS = (
    torch.linalg.LinAlgError,
    np.linalg.LinAlgError,
    FloatingPointError,
    ZeroDivisionError,
)


def describe_error(err: BaseException) -> str:
    """``'<type>: <message>'``, with torch's public name of its C class
    (``LinAlgError``, not ``_LinAlgError``)."""
    return f"{type(err).__name__.lstrip('_')}: {err}"


def raised_stage(err: BaseException) -> Stage:
    """Where ``err`` was raised: ``backward`` when autograd's backward is
    on its traceback, ``loss`` when a frame lies in a ``losses`` package
    (mmdet's, mmrotate's, mmseg's ``models/losses``), else ``forward``."""
    frames = traceback.extract_tb(err.__traceback__)
    if any(
        f.name == 'backward' and 'torch' in f.filename.replace('\\', '/')
        for f in frames
    ):
        return Stage.BACKWARD
    for frame in frames:
        path = frame.filename.replace('\\', '/')
        if '/losses/' in path:
            return Stage.LOSS
    return Stage.FORWARD


class NonFiniteTrainingError(RuntimeError):
    """Training was stopped because a non-finite value appeared.

    The message names the iteration, the epoch, the non-finite loss terms
    with their values, the gradient norm and the incident report's path.
    """


class PoisonedCheckpointError(NonFiniteTrainingError):
    """A checkpoint would have held non-finite weights or optimizer state.

    Raised from ``before_save_checkpoint``, so the file is never written.
    """


class TrainingSpikeError(NonFiniteTrainingError):
    """Training was stopped after a loss or gradient-norm spike (a spike
    skip or rollback that escalated to ``raise``). The message names the
    iteration, the spiking quantity, its value and the running max.
    """


class AmpScaleCollapseError(RuntimeError):
    """The AMP loss scale collapsed and ``AmpScaleMonitorHook`` was told to
    stop (``on_collapse='raise'``, or nothing left to switch to).

    The message names the iteration, the optim wrapper, the precision and
    the cause (scale under ``min_loss_scale``, or the skipped share).
    """


class GuardStateError(ValueError):
    """A value of the guard's own state in a checkpoint (its
    ``nanguard`` key) is not of the form the guard writes: a NaN lr
    multiplier, a negative counter, a string where a number belongs.

    Raised while the checkpoint is loaded, before the value is used; the
    protected runners name the file it came from.

    Args:
        key (str): Where the value sits, below ``nanguard``
            (``'lr_backoff.multiplier'``).
        value: The value found.
        expected (str): The form it must have.
    """

    def __init__(self, key: str, value, expected: str) -> None:
        self.key = f'nanguard.{key}'
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + '...'
        super().__init__(
            f'{self.key} is {shown} ({type(value).__name__}); expected '
            f'{expected}'
        )
