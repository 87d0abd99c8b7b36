# Copyright (c) mmnanguard contributors. All rights reserved.
from .fault_injection_hook import FaultInjectionHook
from .nanguard_hook import NanGuardHook

__all__ = ['NanGuardHook', 'FaultInjectionHook']
