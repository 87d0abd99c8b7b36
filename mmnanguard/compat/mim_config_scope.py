# Copyright (c) mmnanguard contributors. All rights reserved.
"""Mend: ``mmnanguard::_base_/nanguard.py`` config paths (mmengine <= 0.10.7).

mmengine resolves ``PACKAGE::path`` in ``_base_`` only for the packages of
its fixed ``MODULE2PACKAGE`` table (``AssertionError: mmengine does not
support to load mmnanguard config``), and finds the package folder with
``get_installed_path``, which joins the distribution's location with the
package name. Under a PEP 660 editable install (``pip install -e .`` with
setuptools >= 64) the distribution lives in ``site-packages`` while the
code does not, so the returned folder does not exist (this hits mmdet and
mmrotate editable installs as well).

The mend adds ``mmnanguard`` to the table and, where the folder returned by
``get_installed_path`` does not exist, falls back to the folder that the
import system finds for the package. Paths that exist are returned
unchanged. It can go once mmengine lets packages register a config scope
and handles editable installs.
"""

import importlib.util
import os.path as osp
from typing import Callable

from mmengine.config import config as mmengine_config
from mmengine.config import utils as config_utils

from mmnanguard.function_marks import mark

SCOPE = 'mmnanguard'


def _with_import_fallback(get_installed_path: Callable[[str], str]):
    def resolve(package: str) -> str:
        path = get_installed_path(package)
        if osp.isdir(path):
            return path
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.origin is not None:
            return osp.dirname(spec.origin)
        return path

    return mark(resolve, '_nanguard_mend')


def is_needed() -> bool:
    """Whether mmengine lacks the scope or the editable-install fallback."""
    return SCOPE not in config_utils.MODULE2PACKAGE or not getattr(
        mmengine_config.get_installed_path, '_nanguard_mend', False
    )


def apply() -> bool:
    """Register the ``mmnanguard::`` config scope.

    Returns:
        bool: Whether anything was changed.
    """
    if not is_needed():
        return False
    config_utils.MODULE2PACKAGE.setdefault(SCOPE, SCOPE)
    if not getattr(
        mmengine_config.get_installed_path, '_nanguard_mend', False
    ):
        mmengine_config.get_installed_path = _with_import_fallback(
            mmengine_config.get_installed_path
        )
    return True
