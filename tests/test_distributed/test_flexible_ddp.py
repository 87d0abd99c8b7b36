# Copyright (c) mmnanguard contributors. All rights reserved.
"""The include under ``FlexibleRunner`` + ``DDPStrategy``, 2 CPU processes
over gloo, faults planted on rank 1 only.

The config is mmdet's RetinaNet (shrunk, generated COCO images) with the
include in ``_base_`` and its own ``runner_type='FlexibleRunner'``, which
replaces the include's runner: the protected counterpart is built.

Iteration 1: a NaN gradient on rank 1 -> skipped on both ranks.
Iteration 3 (the last, after ``epoch_1.pth`` was written by the strategy
with ``module.``-prefixed keys): a NaN in rank 1's momentum -> rank 1's
weights turn NaN in the step. The check before ``epoch_2.pth`` is written
runs on every rank (the strategy writes on rank 0 only); both ranks roll
back from ``epoch_1.pth``. Without the agreement, rank 0 read the pending
check alone (a collective of one rank) and the run hung or failed.
"""

import glob
import json
import os.path as osp

import pytest
import torch
from integration_utils import run_script

from mmnanguard.testing.distributed import free_port, torchrun_args

HERE = osp.dirname(osp.abspath(__file__))
REPO = osp.dirname(osp.dirname(HERE))
TINY_RETINANET = osp.join(
    REPO, 'configs', 'tiny', 'retinanet_r18_fpn_tiny-coco.py'
)
TRAIN = osp.join(REPO, 'tools', 'train.py')

pytestmark = pytest.mark.slow


def _config(tmp_path, data_root: str) -> str:
    config = tmp_path / 'flexible_ddp.py'
    config.write_text(
        f'_base_ = [{TINY_RETINANET!r}, "mmnanguard::_base_/nanguard.py"]\n'
        "runner_type = 'FlexibleRunner'\n"
        "strategy = dict(type='DDPStrategy')\n"
        "custom_imports = dict(imports=['mmnanguard.testing'],"
        ' allow_failed_imports=False)\n'
        'custom_hooks = [\n'
        "    dict(type='FaultInjectionHook', fault='nan_grad', iteration=1,"
        ' rank=1),\n'
        "    dict(type='FaultInjectionHook', fault='nan_optimizer_state',"
        ' iteration=3, rank=1),\n'
        ']\n'
        "nanguard = dict(rollback_source='checkpoint', hooks=[])\n"
        'train_cfg = dict(max_epochs=2)\n'
        "optim_wrapper = dict(optimizer=dict(lr=0.01, momentum=0.9))\n"
        'train_dataloader = dict(dataset=dict('
        f'data_root={data_root + "/"!r}))\n'
        "default_hooks = dict(checkpoint=dict(interval=1, max_keep_ckpts=3))\n"
    )
    return str(config)


def _run(args, timeout=420):
    return run_script(args, timeout=timeout, env=dict(OMP_NUM_THREADS='1'))


def test_flexible_ddp_skip_and_agreed_checkpoint_rollback(
    tiny_coco_root, tmp_path
):
    config = _config(tmp_path, tiny_coco_root)
    work = tmp_path / 'work'
    out = _run(
        torchrun_args(2, free_port())
        + [osp.join(HERE, 'dist_worker.py'), config, str(work)]
    )
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-6000:]
    assert 'NanGuardFlexibleRunner' in log or 'nanguard active' in log
    # the strategy's checkpoints hold the wrapper's keys
    first = torch.load(
        str(work / 'epoch_1.pth'), map_location='cpu', weights_only=False
    )
    last = torch.load(
        str(work / 'epoch_2.pth'), map_location='cpu', weights_only=False
    )
    assert all(k.startswith('module.') for k in first['state_dict'])
    # the incidents, per rank: the same kinds and actions on both ranks
    by_rank = {0: [], 1: []}
    for path in sorted(
        glob.glob(str(work / 'nanguard' / '*' / 'report.json'))
    ):
        report = json.load(open(path))
        by_rank[report['rank']].append(
            (report['iteration'], report['kind'], report['action'])
        )
    assert by_rank[0] == by_rank[1], by_rank
    kinds = [kind for _, kind, _ in by_rank[0]]
    assert kinds[0] == 'nonfinite_grad' and by_rank[0][0][2] == 'skip'
    assert by_rank[0][0][0] == 1
    assert by_rank[0][-1][2] == 'rollback', by_rank
    assert 'from ' + str(work / 'epoch_1.pth') in log
    # every rank restored the same state: epoch_1.pth's weights, which are
    # also what epoch_2.pth holds (the fault never reached a file)
    reference = {
        k[len('module.') :]: v for k, v in first['state_dict'].items()
    }
    weights = [
        torch.load(
            str(work / f'weights_rank{r}.pth'),
            map_location='cpu',
            weights_only=False,
        )
        for r in (0, 1)
    ]
    for name, expected in reference.items():
        for rank_weights in weights:
            assert torch.equal(rank_weights[name], expected), name
        assert torch.equal(last['state_dict']['module.' + name], expected)
        assert (
            torch.isfinite(expected).all()
            if expected.is_floating_point()
            else True
        )


def test_train_tool_guard_option_on_flexible_runner_config(
    tiny_coco_root, tmp_path
):
    """``tools/train.py --guard skip`` on a ``FlexibleRunner`` config without
    the include (it used to exit 2): the protected counterpart trains."""
    config = tmp_path / 'flexible_plain.py'
    config.write_text(
        f'_base_ = {TINY_RETINANET!r}\n'
        "runner_type = 'FlexibleRunner'\n"
        "strategy = dict(type='DDPStrategy')\n"
        "custom_imports = dict(imports=['mmnanguard.testing'],"
        ' allow_failed_imports=False)\n'
        "custom_hooks = [dict(type='FaultInjectionHook', fault='inf_loss',"
        ' iteration=0, rank=1)]\n'
        'train_cfg = dict(max_epochs=1)\n'
        'train_dataloader = dict(dataset=dict('
        f'data_root={tiny_coco_root + "/"!r}, indices=4))\n'
    )
    work = tmp_path / 'work'
    out = _run(
        torchrun_args(2, free_port())
        + [
            TRAIN,
            str(config),
            '--launcher',
            'pytorch',
            '--guard',
            'skip',
            '--work-dir',
            str(work),
        ]
    )
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-6000:]
    reports = [
        json.load(open(p))
        for p in glob.glob(str(work / 'nanguard' / '*' / 'report.json'))
    ]
    assert sorted(r['rank'] for r in reports) == [0, 1]
    assert {(r['kind'], r['action']) for r in reports} == {
        ('nonfinite_loss', 'skip')
    }
