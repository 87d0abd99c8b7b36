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


@pytest.mark.slow
def test_own_runner_line_is_protected_and_said(tiny_dota_root, tmp_path):
    """The config's own ``runner_type='Runner'`` replaces the include's
    runner; run through ``python -m mmnanguard``, the official script
    still builds the protected counterpart, and the log says why."""
    config = tmp_path / 'own_runner_line.py'
    config.write_text(f"_base_ = [{DEMO_CONFIG!r}]\nrunner_type = 'Runner'\n")
    out = run_script(
        [
            '-m',
            'mmnanguard',
            OFFICIAL_TRAIN,
            str(config),
            '--work-dir',
            str(tmp_path / 'work'),
            '--cfg-options',
            'train_cfg.max_epochs=1',
            'custom_hooks.0.iteration=0',
            *data_options(tiny_dota_root, images=2),
        ]
    )
    assert out.returncode == 0, out.stderr[-3000:]
    log = out.stdout + out.stderr
    assert (
        "runner_type='Runner' (its own line, which replaces the include's "
        'runner)' in log
    )
    assert 'NanGuardRunner, its protected counterpart, is built instead' in log
    reports = glob.glob(
        str(tmp_path / 'work' / 'nanguard' / '*' / 'report.json')
    )
    assert len(reports) == 1
    assert json.load(open(reports[0]))['action'] == 'skip'
