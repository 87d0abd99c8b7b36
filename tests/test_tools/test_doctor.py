# Copyright (c) mmnanguard contributors. All rights reserved.
"""tools/doctor.py: the printed table, the --json file, exit codes, and
a clear message instead of a traceback for bad input."""

import importlib.util
import json
import os
import os.path as osp
import subprocess
import sys

import pytest

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
TOOL = osp.join(REPO, 'tools', 'doctor.py')
FCN = 'mmseg::fcn/fcn_r50-d8_4xb2-40k_cityscapes-512x1024.py'
ROTATED_RETINANET = (
    'mmrotate::rotated_retinanet/'
    'rotated-retinanet-rbox-le90_r50_fpn_1x_dota.py'
)


@pytest.fixture(scope='module')
def tool():
    spec = importlib.util.spec_from_file_location('doctor', TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_json_and_error_exit(tool, tiny_cityscapes_root, tmp_path, capsys):
    out_json = tmp_path / 'doctor.json'
    code = tool.main(
        [
            FCN,
            '--gpus',
            '4',
            '--json',
            str(out_json),
            '--cfg-options',
            f'train_dataloader.dataset.data_root={tiny_cityscapes_root}',
            'model.decode_head.ignore_index=None',
        ]
    )
    assert code == 1  # the 255 finding is an error
    printed = capsys.readouterr().out
    report = json.loads(out_json.read_text())
    assert report['config'] == FCN
    rules = [f['rule'] for f in report['findings']]
    # errors first, then warnings, in the order the rules run
    assert rules == [
        'ignore-index-255',
        'no-warmup',
        'sgd-without-clip-grad',
        'batchnorm-small-batch',
        'lr-scaling-assumed',  # info: mmseg sets no base_batch_size
    ]
    first = report['findings'][0]
    assert first['severity'] == 'error'
    assert first['fix'] == 'model.decode_head.ignore_index=255'
    assert printed.startswith('doctor: 5 finding(s)\n[error] ignore-index-255')
    assert f"    fix: {first['fix']}" in printed


def test_warnings_only_exit_0(tool, capsys):
    assert tool.main([ROTATED_RETINANET]) == 0
    out = capsys.readouterr().out
    assert '[warning] fragile-modules (model.bbox_head.bbox_coder)' in out


@pytest.mark.parametrize(
    'argv, message',
    [
        (['missing.py'], "config file 'missing.py' does not exist"),
        (['nopkg::x.py'], "package 'nopkg' is not installed"),
    ],
)
def test_bad_input_exits_2(tool, capsys, argv, message):
    assert tool.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and 'Traceback' not in err


def test_broken_config_exits_2(tool, tmp_path, capsys):
    config = tmp_path / 'broken.py'
    config.write_text("_base_ = 'does_not_exist.py'\n")
    assert tool.main([str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f'tools/doctor.py: invalid configuration {str(config)!r}'
    )


def test_summary_for_the_smoke_test_reads_the_world_size(monkeypatch):
    from mmengine.config import Config

    from mmnanguard.analysis.config_path import resolve_config_path
    from mmnanguard.analysis.doctor import doctor_summary

    cfg = Config.fromfile(
        resolve_config_path('mmdet::retinanet/retinanet_r50_fpn_1x_coco.py')
    )
    monkeypatch.delenv('WORLD_SIZE', raising=False)
    single = doctor_summary(cfg)
    assert single.startswith('doctor: 3 finding(s)\n')
    assert '8x too high' in single
    monkeypatch.setenv('WORLD_SIZE', '8')
    assert 'lr-above-linear-scaling' not in doctor_summary(cfg)


def test_smoke_test_prints_the_findings_first(tiny_dota_root, tmp_path):
    train = osp.join(REPO, 'tools', 'train.py')
    config = osp.join(
        REPO, 'configs', 'tiny', 'rotated-retinanet-rbox-le90_r18_tiny-dota.py'
    )
    proc = subprocess.run(
        [
            sys.executable,
            train,
            config,
            '--smoke-test',
            '1',
            '--work-dir',
            str(tmp_path),
            '--cfg-options',
            f'train_dataloader.dataset.data_root={tiny_dota_root}/',
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=dict(os.environ, OMP_NUM_THREADS='1'),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    doctor = out.index('doctor: 2 finding(s)\n[warning] fragile-modules')
    assert '[info] lr-scaling-assumed' in out
    assert doctor < out.index('smoke test:\niter 1: ')
