# Copyright (c) mmnanguard contributors. All rights reserved.
"""Numerically safe losses and coders (registered on import)."""

from . import losses, task_modules  # noqa: F401
from .losses import *  # noqa: F401,F403
from .task_modules import *  # noqa: F401,F403
