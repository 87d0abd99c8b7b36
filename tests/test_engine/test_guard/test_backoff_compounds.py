# Copyright (c) mmnanguard contributors. All rights reserved.
"""Repeated rollbacks compound the lr backoff: the user cases of Faster
R-CNN at lr 0.8 and RetinaNet at lr 1.0, each for a batch of 2.

mmdet's ``faster-rcnn_r50_fpn_1x_coco`` (and ``retinanet_r50_fpn_1x_coco``)
is loaded with the include and shrunk by ``benchmarks/zoo_cell.py``
(ResNet-18, 128 px generated COCO images), its warmup shortened to 3
iterations so that the lr reaches its peak within the test. The gradient
explodes at full lr and the guard rolls back to the iteration-0 snapshot
(``snapshot_interval=50``); each rollback must leave half the lr of the
one before (0.5, then 0.25 of the schedule), so the retry does not climb
back to the peak where the first attempt failed. Where a retry fails
depends on the data drawn (which batches, which flips), so the retries
are held to a bound: never above half the peak of the attempt before.
The expected lrs are computed from the config, not read from the guard.
"""

import glob
import os.path as osp
import re
import sys

import pytest
from mmengine.hooks import Hook
from mmengine.registry import RUNNERS

from mmnanguard.engine import NonFiniteTrainingError
from mmnanguard.engine.hooks import NanGuardHook
from mmnanguard.testing import tensors_all_finite

BENCHMARKS = osp.join(
    osp.dirname(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))),
    'benchmarks',
)
sys.path.insert(0, BENCHMARKS)

from zoo_cell import build_cell_config  # noqa: E402

CASES = [
    pytest.param(
        'mmdet::faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py', 0.8, id='faster'
    ),
    pytest.param(
        'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py', 1.0, id='retina'
    ),
]
WARMUP_END = 3
MAX_ITERS = 15


class LrAfterRollback(Hook):
    """After the guard (before the param schedulers step): the lr of every
    param group in the step, and right after each rollback the lrs it
    restored."""

    priority = 'NORMAL'

    def __init__(self):
        self.rollbacks = 0
        self.restored = []
        self.used = {}

    def after_train_iter(
        self, runner, batch_idx, data_batch=None, outputs=None
    ):
        guard = next(h for h in runner.hooks if isinstance(h, NanGuardHook))
        groups = runner.optim_wrapper.optimizer.param_groups
        if guard.counters['rollbacks'] > self.rollbacks:
            self.rollbacks = guard.counters['rollbacks']
            self.restored.append([g['lr'] for g in groups])
        else:
            self.used[runner.iter] = (
                self.rollbacks,
                max(g['lr'] for g in groups),
            )


@pytest.mark.slow
@pytest.mark.parametrize('config, lr', CASES)
def test_rollbacks_halve_the_lr_each_time(tmp_path, config, lr):
    work_dir = str(tmp_path / 'run')
    cfg, _ = build_cell_config(
        config,
        work_dir,
        str(tmp_path / 'data'),
        None,
        MAX_ITERS,
        0,
        img_side=128,
    )
    cfg.optim_wrapper.optimizer.lr = lr
    warmup = cfg.param_scheduler[0]
    assert warmup.type == 'LinearLR'
    warmup.end = WARMUP_END
    cfg.nanguard.update(policy='rollback', lr_backoff=0.5)
    probe = LrAfterRollback()
    runner = RUNNERS.build(cfg)
    runner.register_hook(probe)
    try:
        runner.train()
        stopped = None
    except NonFiniteTrainingError as err:
        stopped = str(err)
    assert probe.rollbacks >= 2
    # the iteration-0 snapshot holds the first warmup lr, LR * start_factor
    start = lr * warmup.start_factor
    first, second = probe.restored[:2]
    assert first == pytest.approx([start * 0.5] * len(first), rel=1e-12)
    assert second == pytest.approx([start * 0.25] * len(second), rel=1e-12)
    # the first attempt reaches the peak; each retry stays at or below
    # half the peak of the one before (where it fails depends on the data)
    peaks = {}
    for attempt, used in probe.used.values():
        peaks[attempt] = max(peaks.get(attempt, 0.0), used)
    assert peaks[0] == pytest.approx(lr)
    for attempt in range(1, probe.rollbacks + 1):
        if attempt in peaks:
            assert peaks[attempt] <= lr * 0.5**attempt * (1 + 1e-9)
    # the messages show the live lrs: failed step -> restored
    log = open(glob.glob(osp.join(work_dir, '*', '*.log'))[0]).read()
    assert f'{lr:.3g}->{start * 0.5:.3g}; rollback 1/3' in log
    failed = re.search(
        rf'lr restored: ([0-9.e+-]+)->{start * 0.25:.3g}; rollback 2/3', log
    )
    assert failed is not None, log[-3000:]
    assert float(failed.group(1)) <= lr * 0.5 * (1 + 1e-3)
    # trained through, or stopped with a report
    if stopped is None:
        assert runner.iter == MAX_ITERS
        assert tensors_all_finite(runner.model.state_dict())
    else:
        assert 'max_rollbacks' in stopped and 'report.json' in stopped
