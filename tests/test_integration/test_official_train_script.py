# Copyright (c) mmnanguard contributors. All rights reserved.
"""mmrotate's official ``tools/train.py`` (unmodified, shipped in
``mmrotate/.mim/tools``) trains the include config protected."""

import glob
import json
import os.path as osp

import mmrotate
import pytest
from integration_utils import DEMO_CONFIG, data_options, run_script

OFFICIAL_TRAIN = osp.join(
    osp.dirname(mmrotate.__file__), '.mim', 'tools', 'train.py'
)


@pytest.mark.slow
def test_official_script_needs_the_mend_before_the_config():
    """It imports mmrotate.models before reading any config, so no config
    key can mend Python 3.11's missing ``collections.Sequence``."""
    source = open(OFFICIAL_TRAIN).read()
    assert source.index(
        'register_all_modules(init_default_scope=False)'
    ) < source.index('Config.fromfile(args.config)')
    out = run_script(
        ['-c', 'import mmrotate.utils as u; ' 'u.register_all_modules(False)'],
        timeout=120,
    )
    assert out.returncode != 0
    assert "cannot import name 'Sequence' from 'collections'" in out.stderr


@pytest.mark.slow
def test_official_script_is_protected(tiny_dota_root, tmp_path):
    out = run_script(
        [
            '-m',
            'mmnanguard',
            OFFICIAL_TRAIN,
            DEMO_CONFIG,
            '--work-dir',
            str(tmp_path),
            '--cfg-options',
            'train_cfg.max_epochs=1',
            'custom_hooks.0.iteration=0',
            *data_options(tiny_dota_root, images=2),
        ]
    )
    assert out.returncode == 0, out.stderr[-3000:]
    log = out.stdout + out.stderr
    assert 'nanguard: protection active' in log
    reports = glob.glob(str(tmp_path / 'nanguard' / '*' / 'report.json'))
    assert len(reports) == 1
    report = json.load(open(reports[0]))
    assert report['kind'] == 'nonfinite_grad'
    assert report['action'] == 'skip'
    assert report['iteration'] == 0
