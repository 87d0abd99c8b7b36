# Copyright (c) mmnanguard contributors. All rights reserved.
from .amp_precision import precision_of, switch_precision
from .cpu_amp_optim_wrapper import CPUAmpOptimWrapper
from .guarded_optim_wrapper import (
    GuardedOptimWrapperMixin,
    install_step_guard,
    optim_wrapper_members,
)

__all__ = [
    'CPUAmpOptimWrapper',
    'GuardedOptimWrapperMixin',
    'install_step_guard',
    'optim_wrapper_members',
    'precision_of',
    'switch_precision',
]
