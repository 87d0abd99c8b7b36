# Copyright (c) mmnanguard contributors. All rights reserved.
"""The guard's building blocks, used by :class:`NanGuardHook`."""

from .dropped_step_scalars import DroppedStepScalars
from .exceptions import (
    AmpScaleCollapseError,
    GuardStateError,
    NonFiniteTrainingError,
    PoisonedCheckpointError,
    TrainingSpikeError,
)
from .history import IterationHistory
from .incident_event import IncidentEvent
from .lr_backoff import LrBackoff
from .responder import GuardResponder
from .settings import GuardSettings
from .snapshot import TrainingSnapshot
from .spike_detector import Spike, SpikeDetector
from .spike_settings import SpikeSettings
from .step_guard import StepGuard
from .verdict import IterationOutcome, StepVerdict

__all__ = [
    'DroppedStepScalars',
    'AmpScaleCollapseError',
    'GuardStateError',
    'NonFiniteTrainingError',
    'PoisonedCheckpointError',
    'TrainingSpikeError',
    'IterationHistory',
    'IncidentEvent',
    'GuardResponder',
    'GuardSettings',
    'TrainingSnapshot',
    'IterationOutcome',
    'StepVerdict',
    'StepGuard',
    'LrBackoff',
    'Spike',
    'SpikeDetector',
    'SpikeSettings',
]
