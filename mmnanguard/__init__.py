# Copyright (c) mmnanguard contributors. All rights reserved.
"""mmnanguard: finite checks, incident reports and recovery for OpenMMLab.

Importing the package first applies the compatibility mends of the pinned
stack (:mod:`mmnanguard.compat`), then registers every module.
"""

from . import compat  # noqa: F401  (must precede any mmrotate import)
from .version import __version__, version_info

compat.apply_all()

from . import datasets, engine, models  # noqa: E402,F401

__all__ = ['__version__', 'version_info']
