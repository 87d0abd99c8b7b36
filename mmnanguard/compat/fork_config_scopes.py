# Copyright (c) mmnanguard contributors. All rights reserved.
"""Mend: ``mmseg::`` config paths under the OneDL fork (onedl-mmengine
0.10.12 with onedl-mmsegmentation 1.4.2).

mmengine resolves ``SCOPE::path`` through its ``MODULE2PACKAGE`` table,
which maps each scope to a *distribution* name, and checks that the
distribution is installed. ``mmseg`` maps to ``mmsegmentation``; the fork
installs the same ``mmseg`` package as ``onedl-mmsegmentation``, so every
``mmseg::`` base stops with ``ModuleNotFoundError: mmsegmentation is not
installed``, with mmseg importable. (``mmdet::`` and ``mmrotate::`` work:
their scope equals their import name, which mmengine falls back to.)

The mend maps such a scope to its import name, for the scopes of
:data:`mmnanguard.supported_stacks.TESTED` whose table entry names a
distribution that is not installed while the scope's package imports.
mmengine then finds the package through its import fallback. Entries whose
distribution is installed are left as they are.
"""

import importlib.util
from importlib import metadata
from typing import Dict

from mmengine.config import utils as config_utils

from mmnanguard.supported_stacks import TESTED


def stale_scopes() -> Dict[str, str]:
    """The scopes whose table entry names a distribution that is missing
    while the scope's package imports.

    Returns:
        dict: scope -> the distribution mmengine looks for.
    """
    stale = {}
    for scope, dist in config_utils.MODULE2PACKAGE.items():
        if scope == dist or scope not in TESTED:
            continue
        try:
            metadata.version(dist)
            continue
        except metadata.PackageNotFoundError:
            pass
        try:
            found = importlib.util.find_spec(scope) is not None
        except (ImportError, ValueError):  # a finder that refuses it
            found = False
        if found:
            stale[scope] = dist
    return stale


def is_needed() -> bool:
    """Whether a tested scope names a distribution that is missing."""
    return bool(stale_scopes())


def apply() -> bool:
    """Map each stale scope to its import name.

    Returns:
        bool: Whether anything was changed.
    """
    stale = stale_scopes()
    for scope in stale:
        config_utils.MODULE2PACKAGE[scope] = scope
    return bool(stale)


__all__ = ['apply', 'is_needed', 'stale_scopes']
