# Copyright (c) mmnanguard contributors. All rights reserved.
"""Numerically safe losses and coders (registered on import; the rotated
ones only where mmrotate imports, see :mod:`mmnanguard.optional`)."""

from typing import Any

from . import losses, task_modules
from .drop_in_resolution import drop_in_for, resolve_type
from .loss_kind import (
    LossKind,
    describe_mismatch,
    encoded_deltas_fix,
    encoded_deltas_into_box_loss,
    loss_kind,
    takes_boxes,
)
from .losses import *  # noqa: F401,F403
from .task_modules import *  # noqa: F401,F403

__all__ = [
    'losses',
    'task_modules',
    'drop_in_for',
    'resolve_type',
    'LossKind',
    'loss_kind',
    'takes_boxes',
    'encoded_deltas_into_box_loss',
    'describe_mismatch',
    'encoded_deltas_fix',
]
__all__ += losses.__all__ + task_modules.__all__


def __getattr__(name: str) -> Any:
    """A rotated module name without mmrotate raises the clear error of
    :mod:`mmnanguard.optional`; any other unknown name AttributeError."""
    if name in losses.ROTATED:
        return getattr(losses, name)
    if name in task_modules.coders.ROTATED:
        return getattr(task_modules, name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
