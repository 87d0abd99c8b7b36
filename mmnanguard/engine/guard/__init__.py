# Copyright (c) mmnanguard contributors. All rights reserved.
"""The guard's building blocks, used by :class:`NanGuardHook`."""

from .exceptions import (
    AmpScaleCollapseError,
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
    'AmpScaleCollapseError',
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
