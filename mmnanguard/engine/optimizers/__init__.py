# Copyright (c) mmnanguard contributors. All rights reserved.
from ..guard.optim_members import optim_wrapper_members
from .amp_precision import precision_of, switch_precision
from .cpu_amp_optim_wrapper import CPUAmpOptimWrapper
from .guarded_deepspeed_optim_wrapper import GuardedDeepSpeedOptimWrapper
from .guarded_optim_wrapper import (
    GUARDED_TYPES,
    GuardedAmpOptimWrapper,
    GuardedCPUAmpOptimWrapper,
    GuardedOptimWrapper,
    GuardedOptimWrapperMixin,
    install_step_guard,
)

__all__ = [
    'CPUAmpOptimWrapper',
    'GUARDED_TYPES',
    'GuardedAmpOptimWrapper',
    'GuardedCPUAmpOptimWrapper',
    'GuardedDeepSpeedOptimWrapper',
    'GuardedOptimWrapper',
    'GuardedOptimWrapperMixin',
    'install_step_guard',
    'optim_wrapper_members',
    'precision_of',
    'switch_precision',
]
