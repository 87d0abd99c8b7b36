# Copyright (c) mmnanguard contributors. All rights reserved.
"""mmnanguard: finite checks, incident reports and recovery for OpenMMLab.

Importing the package first applies the compatibility mends of the pinned
stack (:mod:`mmnanguard.compat`), then registers every module. It needs
mmengine, mmcv and mmdet; the rotated-box modules register where mmrotate
imports, and placeholders with a clear error stand in for them where it
does not (:mod:`mmnanguard.optional`).
"""

from . import compat  # noqa: F401  (must precede any mmrotate import)
from .version import __version__, version_info

compat.apply_all()

from . import datasets, engine, models  # noqa: E402,F401

__all__ = ['__version__', 'version_info']
