# Copyright (c) mmnanguard contributors. All rights reserved.
"""The guard's building blocks, used by :class:`NanGuardHook`."""
from .exceptions import NonFiniteTrainingError, PoisonedCheckpointError
from .history import IterationHistory
from .incident import IncidentRecorder, load_report
from .settings import GuardSettings
from .snapshot import TrainingSnapshot
from .step_guard import IterationRecord, StepGuard

__all__ = [
    'NonFiniteTrainingError', 'PoisonedCheckpointError', 'IterationHistory',
    'IncidentRecorder', 'load_report', 'GuardSettings', 'TrainingSnapshot',
    'IterationRecord', 'StepGuard'
]
