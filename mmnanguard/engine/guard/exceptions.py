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
