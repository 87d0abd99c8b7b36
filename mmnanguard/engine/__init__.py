# Copyright (c) mmnanguard contributors. All rights reserved.
from . import hooks, optimizers, runner  # noqa: F401
from .guard import NonFiniteTrainingError, PoisonedCheckpointError

__all__ = ['NonFiniteTrainingError', 'PoisonedCheckpointError']
