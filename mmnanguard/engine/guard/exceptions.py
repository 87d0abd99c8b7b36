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
