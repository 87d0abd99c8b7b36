# Copyright (c) mmnanguard contributors. All rights reserved.
"""``tools/train.py``'s flags that the README promises: ``--amp`` on a CPU,
``--auto-scale-lr``, ``--resume`` of a protected run, a runner that cannot
be built (one paragraph, exit 2), and ``make demo`` itself."""

import contextlib
import glob
import importlib.util
import io
import json
import os
import os.path as osp
import re
import subprocess

import pytest
import torch
from integration_utils import (
    DEMO_CONFIG,
    REPO,
    TRAIN,
    data_options,
    run_script,
)

from mmnanguard.testing import (
    TINY_COCO_CONFIG,
    TINY_DOTA_CONFIG,
    tensors_all_finite,
)


def one_paragraph(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith('tools/')]
    assert len(lines) == 1, stderr[-3000:]
    assert 'Traceback' not in stderr
    return lines[0]


@pytest.fixture(scope='module')
def train_tool():
    """``tools/train.py`` as a module, for ``main(argv)`` in-process."""
    spec = importlib.util.spec_from_file_location('train_tool', TRAIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_main(tool, argv):
    """``tool.main(argv)``'s exit status (argparse's exits included) and
    its stderr.

    Only stderr is redirected: mmengine's loggers keep the ``sys.stdout``
    they were created with, and a later test's logging into a capture
    stream closed with its test (``capsys``) would print a logging error.
    """
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = tool.main(argv)
        except SystemExit as done:
            code = done.code
    return code, err.getvalue()


CANNOT_BE_BUILT = [
    (['model.bbox_head.type=NoSuchHead'], 'NoSuchHead'),
    (['model.backbone.depth=19'], 'invalid depth 19'),
    # the dataset is built before training too (mmengine: lazily)
    (
        ['train_dataloader.dataset.data_root={tmp}/missing/'],
        'There is no txt file in {tmp}/missing/trainval/annfiles/',
    ),
]


def cannot_be_built_argv(tmp_path, options):
    """The flags; a run name of its own, so that in-process runs started
    within one second do not share mmengine's logger of that name."""
    return [
        TINY_DOTA_CONFIG,
        '--guard',
        'skip',
        '--work-dir',
        str(tmp_path),
        '--cfg-options',
        f'experiment_name={tmp_path.name}',
        *[o.format(tmp=tmp_path) for o in options],
    ]


def check_cannot_be_built(code, stderr, words):
    assert code == 2
    message = one_paragraph(stderr)
    assert message.startswith(
        f'tools/train.py: cannot build the runner from {TINY_DOTA_CONFIG!r}'
    )
    assert words in message and 'Nothing was trained' in message


@pytest.mark.parametrize('options, words', CANNOT_BE_BUILT)
def test_runner_that_cannot_be_built(train_tool, tmp_path, options, words):
    argv = cannot_be_built_argv(tmp_path, options)
    code, stderr = run_main(train_tool, argv)
    check_cannot_be_built(code, stderr, words.format(tmp=tmp_path))


@pytest.mark.slow
def test_runner_that_cannot_be_built_through_the_cli(tmp_path):
    """The same paragraph and exit status from the real command line."""
    options, words = CANNOT_BE_BUILT[0]
    argv = cannot_be_built_argv(tmp_path, options)
    out = run_script([TRAIN] + argv, timeout=120)
    check_cannot_be_built(out.returncode, out.stderr, words)


def test_unparsable_cfg_option(train_tool):
    """mmengine's DictAction recursed without end on this value."""
    argv = [
        TINY_DOTA_CONFIG,
        '--cfg-options',
        "custom_hooks=[dict(type='X',iteration=1)]",
    ]
    code, stderr = run_main(train_tool, argv)
    assert code == 2
    assert 'Traceback' not in stderr
    assert 'argument --cfg-options: cannot parse "custom_hooks=[dict(' in (
        stderr
    )


@pytest.mark.slow
def test_amp_selects_the_cpu_wrapper(tiny_dota_root, tmp_path):
    out = run_script(
        [
            TRAIN,
            TINY_DOTA_CONFIG,
            '--amp',
            '--smoke-test',
            '1',
            '--work-dir',
            str(tmp_path),
            '--cfg-options',
            'train_dataloader.dataset.pipeline.3.scale=(128,128)',
            f'train_dataloader.dataset.data_root={tiny_dota_root}/',
        ]
    )
    assert out.returncode == 0, out.stderr[-3000:]
    log = out.stdout + out.stderr
    assert '--amp: optim_wrapper.type=CPUAmpOptimWrapper' in log
    hooks = next(line for line in log.splitlines() if 'hooks in order' in line)
    assert 'AmpScaleMonitorHook' in hooks  # AMP was built, not just named
    (dump,) = glob.glob(str(tmp_path / '*' / 'vis_data' / 'config.py'))
    with open(dump) as f:
        text = f.read()
    assert "type='CPUAmpOptimWrapper'" in text
    assert "loss_scale='dynamic'" in text
    assert 'smoke test passed: 1 iterations' in out.stdout


@pytest.mark.slow
def test_auto_scale_lr(tiny_coco_root, tmp_path):
    """mmdet's RetinaNet: lr 0.01 for a batch of 16, warm-up from 0.001x;
    at batch 2 the first iteration runs at 0.01 * 2/16 * 0.001."""
    out = run_script(
        [
            TRAIN,
            TINY_COCO_CONFIG,
            '--auto-scale-lr',
            '--smoke-test',
            '1',
            '--work-dir',
            str(tmp_path),
            '--cfg-options',
            f'train_dataloader.dataset.data_root={tiny_coco_root}/',
        ]
    )
    assert out.returncode == 0, out.stderr[-3000:]
    log = out.stdout + out.stderr
    assert (
        'LR is set based on batch size of 16 and the current batch size '
        'is 2. Scaling the original LR by 0.125.'
    ) in log
    lr = float(re.search(r'Iter\(train\) \[1/1\]\s+lr: (\S+)', log)[1])
    assert lr == pytest.approx(0.01 * 2 / 16 * 0.001, rel=1e-3)


def test_auto_scale_lr_needs_a_base_batch_size(train_tool):
    argv = [TINY_DOTA_CONFIG, '--auto-scale-lr']
    code, stderr = run_main(train_tool, argv)
    assert code == 2
    assert 'needs auto_scale_lr.base_batch_size' in one_paragraph(stderr)


@pytest.mark.slow
def test_resume_continues_counters_and_snapshots(tiny_dota_root, tmp_path):
    """Run 1: 2 iterations, an inf loss at iteration 1 skipped. Run 2
    resumes it for 2 more under rollback, with a NaN gradient at
    iteration 3: the counters continue from the checkpoint, incident
    folders are numbered on, and the rollback restores the snapshot the
    resumed run took at iteration 2."""
    common = [
        TRAIN,
        DEMO_CONFIG,
        '--work-dir',
        str(tmp_path),
        '--cfg-options',
        'nanguard.hooks.1.diagnose_incidents=0',
        *data_options(tiny_dota_root, images=4),
    ]
    first = run_script(
        common
        + [
            'custom_hooks.0.fault=inf_loss',
            'custom_hooks.0.iteration=1',
            'train_cfg.max_epochs=1',
        ]
    )
    assert first.returncode == 0, first.stderr[-3000:]
    ckpt = torch.load(
        str(tmp_path / 'epoch_1.pth'), map_location='cpu', weights_only=False
    )
    assert ckpt['nanguard']['counters']['incidents'] == 1
    assert ckpt['nanguard']['counters']['skipped'] == 1
    second = run_script(
        common
        + [
            'custom_hooks.0.fault=nan_grad',
            'custom_hooks.0.iteration=3',
            'train_cfg.max_epochs=2',
            'nanguard.policy=rollback',
        ]
        + ['--resume']
    )
    assert second.returncode == 0, second.stderr[-3000:]
    log = second.stdout + second.stderr
    assert 'resumed epoch: 1, iter: 2' in log
    assert 'rolled back to the state of iteration 2 (from memory)' in log
    ckpt = torch.load(
        str(tmp_path / 'epoch_2.pth'), map_location='cpu', weights_only=False
    )
    assert ckpt['meta']['iter'] == 4
    counters = ckpt['nanguard']['counters']
    # both incidents dropped their step; the second also rolled back
    assert (counters['incidents'], counters['skipped']) == (2, 2)
    assert counters['rollbacks'] == 1
    assert tensors_all_finite(ckpt['state_dict'])
    folders = sorted(
        osp.basename(f) for f in glob.glob(str(tmp_path / 'nanguard' / '*'))
    )
    assert folders == ['incident_000_iter000001', 'incident_001_iter000003']
    with open(str(tmp_path / 'nanguard' / folders[1] / 'report.json')) as f:
        report = json.load(f)
    assert (report['kind'], report['action']) == (
        'nonfinite_grad',
        'rollback',
    )


@pytest.mark.slow
def test_make_demo(tmp_path):
    """The recipe of ``make demo`` (as ``make -n`` prints it), run with a
    temporary work dir."""
    # under an outer make (`make test`) a nested make would print its
    # "Entering/Leaving directory" lines: run it as a top-level make
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ('MAKEFLAGS', 'MAKELEVEL', 'MFLAGS')
    }
    recipe = subprocess.run(
        ['make', '--no-print-directory', '-n', 'demo'],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout.splitlines()
    assert recipe[-1].split()[1:] == ['tools/demo.py']
    out = run_script(
        ['tools/demo.py', '--work-dir', str(tmp_path / 'demo')], timeout=400
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert (
        'OK: both planted problems detected, skipped, reported; weights '
        'finite'
    ) in out.stdout
    assert 'detected nonfinite_loss at iteration' in out.stdout
    assert 'detected nonfinite_grad at iteration 6' in out.stdout
