# Copyright (c) mmnanguard contributors. All rights reserved.
"""Mend: ``from collections import Sequence`` in mmrotate 1.0.0rc1.

``mmrotate/models/detectors/refine_single_stage.py`` (1.0.0rc1, the only 1.x
release on PyPI) imports ``Sequence`` from :mod:`collections`. The alias was
removed in Python 3.10, so ``import mmrotate.models`` fails there.

The mend restores that one alias, pointing at :class:`collections.abc.Sequence`
(the object the old alias pointed at). It can go once mmrotate ships a
release newer than 1.0.0rc1.
"""

import collections
import collections.abc
import sys
from importlib import metadata

#: mmrotate releases that contain the old import.
AFFECTED_MMROTATE = ('1.0.0rc0', '1.0.0rc1')


def is_needed() -> bool:
    """Whether the running Python and mmrotate need the mend."""
    if sys.version_info < (3, 10) or hasattr(collections, 'Sequence'):
        return False
    try:
        version = metadata.version('mmrotate')
    except metadata.PackageNotFoundError:
        return False
    return version in AFFECTED_MMROTATE


def apply() -> bool:
    """Apply the mend where needed.

    Returns:
        bool: Whether the alias was added.
    """
    if not is_needed():
        return False
    collections.Sequence = collections.abc.Sequence  # type: ignore[attr-defined]
    return True
