# Copyright (c) mmnanguard contributors. All rights reserved.
"""``tools/train.py``: flags checked before training, ``--guard``,
``--smoke-test``, an AMP config with ``clip_grad``, the clean stop."""

import glob
import json
import os.path as osp

import pytest
from integration_utils import (
    DEMO_CONFIG,
    NANGUARD_DOTA,
    TRAIN,
    data_options,
    run_script,
)
from mmengine.runner.checkpoint import CheckpointLoader

from mmnanguard.testing import TINY_DOTA_CONFIG, tensors_all_finite


@pytest.mark.slow
def test_wrong_guard_value_fails_before_training(tmp_path):
    out = run_script(
        [TRAIN, NANGUARD_DOTA, '--guard', 'skp', '--work-dir', str(tmp_path)],
        timeout=120,
    )
    assert out.returncode == 2
    assert "argument --guard: invalid choice: 'skp'" in out.stderr
    assert "'raise', 'skip', 'rollback', 'off'" in out.stderr
    assert not glob.glob(str(tmp_path / '*'))  # nothing started


@pytest.mark.slow
def test_missing_config_fails_before_training(tmp_path):
    missing = str(tmp_path / 'no_such_config.py')
    out = run_script([TRAIN, missing], timeout=120)
    assert out.returncode == 2
    assert f"config file '{missing}' does not exist" in out.stderr


@pytest.mark.slow
def test_invalid_setting_fails_before_training(tmp_path):
    out = run_script(
        [
            TRAIN,
            NANGUARD_DOTA,
            '--work-dir',
            str(tmp_path),
            '--cfg-options',
            'nanguard.lr_backoff=2.0',
        ],
        timeout=120,
    )
    assert out.returncode == 2
    assert 'lr_backoff=2.0 is invalid' in out.stderr
    assert 'Traceback' not in out.stderr
    assert not glob.glob(str(tmp_path / '*'))


@pytest.mark.slow
def test_amp_config_with_clip_grad(tiny_dota_root, tmp_path):
    """The include on an AMP config (CPUAmpOptimWrapper: the upstream
    AmpOptimWrapper on the CPU GradScaler), with upstream's clip_grad and
    an infinite loss planted at iteration 0. Half precision is slow on
    the CPU: 128 px images, and the diagnosis replay is off."""
    out = run_script(
        [
            TRAIN,
            DEMO_CONFIG,
            '--work-dir',
            str(tmp_path),
            '--cfg-options',
            'optim_wrapper.type=CPUAmpOptimWrapper',
            'optim_wrapper.dtype=bfloat16',
            'custom_hooks.0.fault=inf_loss',
            'custom_hooks.0.iteration=0',
            'train_cfg.max_epochs=1',
            'train_dataloader.dataset.pipeline.3.scale=(128,128)',
            'nanguard.hooks.1.diagnose_incidents=0',
            *data_options(tiny_dota_root, images=4),
        ]
    )
    assert out.returncode == 0, out.stderr[-3000:]
    log = out.stdout + out.stderr
    hooks_line = next(
        line
        for line in log.splitlines()
        if 'protection active, hooks in order' in line
    )
    assert 'NanGuardHook' in hooks_line
    assert 'AmpScaleMonitorHook' in hooks_line  # added because of AMP
    ckpt = CheckpointLoader.load_checkpoint(
        str(tmp_path / 'epoch_1.pth'), map_location='cpu'
    )
    assert tensors_all_finite(ckpt['state_dict'])
    assert tensors_all_finite(ckpt['optimizer'])
    assert 'loss_scaler' in ckpt['optimizer']  # AMP state was saved
    assert ckpt['meta']['iter'] == 2
    assert ckpt['nanguard']['counters']['incidents'] == 1
    assert ckpt['nanguard']['counters']['skipped'] == 1
    cfg_dump = open(glob.glob(str(tmp_path / '*.py'))[0]).read()
    assert "type='CPUAmpOptimWrapper'" in cfg_dump
    assert 'clip_grad=dict(max_norm=35, norm_type=2)' in cfg_dump


@pytest.mark.slow
def test_guard_raise_stops_cleanly(tiny_dota_root, tmp_path):
    """``--guard raise`` on a config without the include: the injected
    fault stops training with one paragraph and status 3."""
    out = run_script(
        [
            TRAIN,
            DEMO_CONFIG,
            '--guard',
            'raise',
            '--work-dir',
            str(tmp_path),
            '--cfg-options',
            'custom_hooks.0.iteration=0',
            *data_options(tiny_dota_root, images=2),
        ]
    )
    assert out.returncode == 3, out.stderr[-3000:]
    assert 'Traceback' not in out.stderr
    message = [
        line
        for line in out.stderr.splitlines()
        if line.startswith('tools/train.py:')
    ]
    assert len(message) == 1
    assert (
        'NonFiniteTrainingError: nanguard stopped training: '
        'nonfinite_grad at iteration 0' in message[0]
    )
    report = glob.glob(str(tmp_path / 'nanguard' / '*' / 'report.json'))
    assert len(report) == 1 and report[0] in message[0]
    assert json.load(open(report[0]))['action'] == 'raise'


@pytest.mark.slow
def test_smoke_test_passes_on_a_config_without_protection(
    tiny_dota_root, tmp_path
):
    out = run_script(
        [
            TRAIN,
            TINY_DOTA_CONFIG,
            '--smoke-test',
            '2',
            '--work-dir',
            str(tmp_path),
            '--cfg-options',
            f'train_dataloader.dataset.data_root={tiny_dota_root}/',
        ]
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [
        line for line in out.stdout.splitlines() if line.startswith('iter ')
    ]
    assert [line.split(':')[0] for line in lines] == ['iter 1', 'iter 2']
    for line in lines:
        values = dict(kv.split('=') for kv in line.split(': ')[1].split())
        assert set(values) == {'loss', 'loss_cls', 'loss_bbox', 'grad_norm'}
        # a fresh focal-loss head: loss_cls near 1.13 (alpha 0.25, p=0.01)
        assert 0.5 < float(values['loss_cls']) < 2.0
        assert 0 < float(values['grad_norm']) < 1e3
    assert 'smoke test passed: 2 iterations' in out.stdout
    assert not glob.glob(str(tmp_path / '*.pth'))  # no checkpoints


@pytest.mark.slow
def test_smoke_test_fails_on_a_nonfinite_value(tiny_dota_root, tmp_path):
    out = run_script(
        [
            TRAIN,
            DEMO_CONFIG,
            '--smoke-test',
            '2',
            '--work-dir',
            str(tmp_path),
            '--cfg-options',
            'custom_hooks.0.iteration=1',
            f'train_dataloader.dataset.data_root={tiny_dota_root}/',
        ]
    )
    assert out.returncode == 1, out.stderr[-3000:]
    lines = [
        line for line in out.stdout.splitlines() if line.startswith('iter ')
    ]
    assert len(lines) == 2
    assert 'NON-FINITE' not in lines[0]
    assert "NON-FINITE: ['grad_norm']" in lines[1]
    assert 'smoke test failed' in out.stderr
    assert osp.isdir(str(tmp_path / 'nanguard'))
