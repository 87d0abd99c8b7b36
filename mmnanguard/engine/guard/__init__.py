# Copyright (c) mmnanguard contributors. All rights reserved.
"""The guard's building blocks, used by :class:`NanGuardHook`."""

from .exceptions import (
    AmpScaleCollapseError,
    NonFiniteTrainingError,
    PoisonedCheckpointError,
    TrainingSpikeError,
)
from .history import IterationHistory
from .incident import IncidentRecorder, load_report
from .lr_backoff import LrBackoff
from .settings import GuardSettings
from .snapshot import TrainingSnapshot
from .spike_detector import Spike, SpikeDetector
from .spike_settings import SpikeSettings
from .step_guard import IterationRecord, StepGuard

__all__ = [
    'AmpScaleCollapseError',
    'NonFiniteTrainingError',
    'PoisonedCheckpointError',
    'TrainingSpikeError',
    'IterationHistory',
    'IncidentRecorder',
    'load_report',
    'GuardSettings',
    'TrainingSnapshot',
    'IterationRecord',
    'StepGuard',
    'LrBackoff',
    'Spike',
    'SpikeDetector',
    'SpikeSettings',
]
