# Copyright (c) mmnanguard contributors. All rights reserved.
"""The ``mmnanguard::`` config scope mend (mmengine <= 0.10.7)."""

import os.path as osp

import mmdet
import pytest
from mmengine.config import config as mmengine_config
from mmengine.config.utils import MODULE2PACKAGE

import mmnanguard
from mmnanguard.compat import APPLIED, mim_config_scope

pytestmark = pytest.mark.stack_smoke


def test_scope_registered_and_idempotent():
    assert MODULE2PACKAGE['mmnanguard'] == 'mmnanguard'
    assert 'mim_config_scope' in APPLIED
    assert mim_config_scope.apply() is False  # already applied


def test_package_path_resolves_to_the_code():
    path = mmengine_config.get_installed_path('mmnanguard')
    assert path == osp.dirname(mmnanguard.__file__)
    include = osp.join(path, '.mim', 'configs', '_base_', 'nanguard.py')
    assert osp.isfile(include)


def test_existing_paths_are_unchanged():
    assert mmengine_config.get_installed_path('mmdet') == osp.dirname(
        mmdet.__file__
    )
