# Copyright (c) mmnanguard contributors. All rights reserved.
"""Files that are complete or absent: durable writes and checkpoint checks.

Stdlib and :mod:`mmnanguard.compat` only, so that the runner, the guard
and the incident folders can all use it without an import cycle.
"""

from .checkpoint_verify import (
    LOAD_ERRORS,
    checkpoint_problem,
    verified_checkpoints,
)
from .durable_file import DurableWriteError

__all__ = [
    'DurableWriteError',
    'LOAD_ERRORS',
    'checkpoint_problem',
    'verified_checkpoints',
]
