# Copyright (c) mmnanguard contributors. All rights reserved.
"""mmnanguard: finite checks, incident reports and recovery for OpenMMLab.

Importing the package first checks the installed stack
(:mod:`mmnanguard.supported_stacks`), then applies the compatibility mends
(:mod:`mmnanguard.compat`), then registers every module. It needs mmengine,
mmcv and mmdet, from OpenMMLab or the OneDL fork; the rotated-box modules
register where mmrotate imports, and placeholders with a clear error stand
in for them where it does not (:mod:`mmnanguard.optional`).
"""

from .supported_stacks import check_installed

check_installed()  # a clear ImportError before mmengine is first imported

from . import compat  # noqa: E402,F401  (must precede any mmrotate import)
from .version import __version__, version_info  # noqa: E402

compat.apply_all()

from . import datasets, engine, models  # noqa: E402,F401

__all__ = ['__version__', 'version_info']
