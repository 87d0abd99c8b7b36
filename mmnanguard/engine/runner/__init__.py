# Copyright (c) mmnanguard contributors. All rights reserved.
from .nanguard_runner import NanGuardRunner
from .protection import ProtectionSettings

__all__ = ['NanGuardRunner', 'ProtectionSettings']
