# Copyright (c) mmnanguard contributors. All rights reserved.
"""The ``mmseg::`` scope mend (onedl-mmsegmentation 1.4.2): on every stack
with mmseg an ``mmseg::`` base loads; with the distribution made missing,
the scope maps to the import name and resolves to the same file."""

import os.path as osp
from importlib import metadata

import mmseg
import pytest
from mmengine.config import Config
from mmengine.config import utils as config_utils

from mmnanguard.compat import APPLIED, fork_config_scopes

pytestmark = pytest.mark.stack_smoke

FCN = 'fcn/fcn_r18-d8_4xb2-80k_cityscapes-512x1024.py'
UPSTREAM_FILE = osp.join(osp.dirname(mmseg.__file__), '.mim', 'configs', FCN)


def _user_config(tmp_path):
    path = tmp_path / 'user_fcn.py'
    path.write_text(f"_base_ = 'mmseg::{FCN}'\n")
    return str(path)


def test_mmseg_base_loads_on_this_stack(tmp_path):
    cfg = Config.fromfile(_user_config(tmp_path))
    assert cfg.model.type == 'EncoderDecoder'
    assert cfg.model.backbone.depth == 18
    assert fork_config_scopes.stale_scopes() == {}
    assert 'fork_config_scopes' in APPLIED


def test_missing_distribution_maps_scope_to_import_name(monkeypatch, tmp_path):
    installed = {}
    for dist in ('mmsegmentation', 'onedl-mmsegmentation'):
        try:
            installed[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    assert len(installed) == 1  # one family provides mmseg here
    real_version = metadata.version

    def version(dist):
        if dist == 'mmsegmentation':
            raise metadata.PackageNotFoundError(dist)
        return real_version(dist)

    monkeypatch.setattr(fork_config_scopes.metadata, 'version', version)
    monkeypatch.setitem(config_utils.MODULE2PACKAGE, 'mmseg', 'mmsegmentation')
    assert fork_config_scopes.stale_scopes() == {'mmseg': 'mmsegmentation'}
    assert fork_config_scopes.apply() is True
    assert config_utils.MODULE2PACKAGE['mmseg'] == 'mmseg'
    assert fork_config_scopes.apply() is False
    cfg = Config.fromfile(_user_config(tmp_path))
    assert cfg.model.backbone.depth == 18
    path, scope = Config._get_cfg_path(f'mmseg::{FCN}', str(tmp_path))
    assert (path, scope) == (UPSTREAM_FILE, 'mmseg')
