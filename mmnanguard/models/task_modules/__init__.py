# Copyright (c) mmnanguard contributors. All rights reserved.
from typing import Any

from . import coders
from .coders import *  # noqa: F401,F403

__all__ = list(coders.__all__)


def __getattr__(name: str) -> Any:
    """Names of :mod:`.coders` that need a missing package raise its
    clear error here too."""
    return getattr(coders, name)
