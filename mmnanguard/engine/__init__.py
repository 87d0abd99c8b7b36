# Copyright (c) mmnanguard contributors. All rights reserved.
from . import hooks, optimizers, runner  # noqa: F401
from .guard import (
    AmpScaleCollapseError,
    NonFiniteTrainingError,
    PoisonedCheckpointError,
)

__all__ = [
    'AmpScaleCollapseError',
    'NonFiniteTrainingError',
    'PoisonedCheckpointError',
]
