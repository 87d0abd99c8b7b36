# Copyright (c) mmnanguard contributors. All rights reserved.
from mmnanguard.fileio.checkpoint_verify import (
    LOAD_ERRORS,
    checkpoint_problem,
    verified_checkpoints,
)
from mmnanguard.fileio.durable_file import DurableWriteError, write_durable

from .durable_checkpoint_hook import DurableCheckpointHook
from .model_facts import ModelFacts, facts_from_config, read_model_facts
from .nanguard_flexible_runner import NanGuardFlexibleRunner
from .nanguard_runner import NanGuardRunner
from .preemption import EXIT_PREEMPTED, PreemptionHook, TrainingPreempted
from .protection import ProtectionSettings
from .resume_choice import UnusableCheckpointError, choose_resume_checkpoint
from .rewrite import rewrite_config
from .upstream_builds import protect_upstream_builds

protect_upstream_builds()

__all__ = [
    'DurableCheckpointHook',
    'DurableWriteError',
    'EXIT_PREEMPTED',
    'LOAD_ERRORS',
    'ModelFacts',
    'NanGuardFlexibleRunner',
    'NanGuardRunner',
    'PreemptionHook',
    'ProtectionSettings',
    'TrainingPreempted',
    'UnusableCheckpointError',
    'checkpoint_problem',
    'choose_resume_checkpoint',
    'facts_from_config',
    'read_model_facts',
    'rewrite_config',
    'verified_checkpoints',
    'write_durable',
]
