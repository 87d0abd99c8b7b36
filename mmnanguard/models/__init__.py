# Copyright (c) mmnanguard contributors. All rights reserved.
"""Numerically safe losses and coders (registered on import)."""

from . import losses, task_modules
from .losses import *  # noqa: F401,F403
from .task_modules import *  # noqa: F401,F403

__all__ = ['losses', 'task_modules']
__all__ += losses.__all__ + task_modules.__all__
