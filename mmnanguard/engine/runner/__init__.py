# Copyright (c) mmnanguard contributors. All rights reserved.
from .model_facts import ModelFacts, facts_from_config, read_model_facts
from .nanguard_runner import NanGuardRunner
from .protection import ProtectionSettings
from .rewrite import rewrite_config

__all__ = [
    'ModelFacts',
    'NanGuardRunner',
    'ProtectionSettings',
    'facts_from_config',
    'read_model_facts',
    'rewrite_config',
]
