# Copyright (c) mmnanguard contributors. All rights reserved.
"""Named exceptions raised by the guard."""


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
