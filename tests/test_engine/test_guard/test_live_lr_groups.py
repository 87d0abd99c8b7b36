# Copyright (c) mmnanguard contributors. All rights reserved.
"""The history holds the live lr of every param group, and the explosion
check finds an lr above the schedule in any group.

mmdet's ``retinanet_r50_fpn_1x_coco`` (with the include, shrunk by
``benchmarks/zoo_cell.py``) gets a ``paramwise_cfg`` (backbone
``lr_mult=0.1``, ``bias_lr_mult=2``) and keeps its warmup ``LinearLR``. At
one iteration the lr of the head's groups is multiplied by 1e4 (a spike
that leaves the first group, a backbone one, alone). The expected lr of
every group is computed from the config by hand: mmengine's rules for
``paramwise_cfg`` and LinearLR's closed form.
"""

import os.path as osp
import sys

import pytest
from mmengine.hooks import Hook
from mmengine.registry import RUNNERS

from mmnanguard.engine.diagnosis.explosion import lr_off_schedule
from mmnanguard.engine.guard.report import learning_rates
from mmnanguard.engine.guard.snapshot import unwrap_model
from mmnanguard.engine.hooks import NanGuardHook

BENCHMARKS = osp.join(
    osp.dirname(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))),
    'benchmarks',
)
sys.path.insert(0, BENCHMARKS)

from zoo_cell import build_cell_config  # noqa: E402

CONFIG = 'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py'
SPIKE_ITER = 3
SPIKE = 1e4
BACKBONE_MULT, BIAS_MULT = 0.1, 2.0


class HeadLrSpike(Hook):
    """Multiply the lr of the groups of ``bbox_head`` parameters by
    ``SPIKE`` for one iteration."""

    priority = 'LOWEST'

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        if runner.iter != SPIKE_ITER:
            return
        head = {
            id(p) for p in unwrap_model(runner.model).bbox_head.parameters()
        }
        for group in runner.optim_wrapper.optimizer.param_groups:
            if id(group['params'][0]) in head:
                group['lr'] *= SPIKE


def expected_mult(name, param):
    """mmengine's DefaultOptimWrapperConstructor: a frozen parameter keeps
    the base lr; a custom key wins over ``bias_lr_mult``."""
    if not param.requires_grad:
        return 1.0
    if 'backbone' in name:
        return BACKBONE_MULT
    if name.endswith('.bias'):
        return BIAS_MULT
    return 1.0


def test_history_holds_every_groups_live_lr(tmp_path):
    work_dir = str(tmp_path / 'run')
    cfg, _ = build_cell_config(
        CONFIG,
        work_dir,
        str(tmp_path / 'data'),
        None,
        SPIKE_ITER + 1,
        0,
        img_side=128,
    )
    cfg.optim_wrapper.paramwise_cfg = dict(
        custom_keys={'backbone': dict(lr_mult=BACKBONE_MULT)},
        bias_lr_mult=BIAS_MULT,
    )
    cfg.nanguard.hooks = []
    warmup = cfg.param_scheduler[0]
    assert warmup.type == 'LinearLR' and warmup.end > SPIKE_ITER + 1
    base = cfg.optim_wrapper.optimizer.lr
    runner = RUNNERS.build(cfg)
    runner.register_hook(HeadLrSpike())
    runner.train()

    model = unwrap_model(runner.model)
    names = {id(p): (n, p) for n, p in model.named_parameters()}
    groups = runner.optim_wrapper.optimizer.param_groups
    mults = [expected_mult(*names[id(g['params'][0])]) for g in groups]
    in_head = [
        names[id(g['params'][0])][0].startswith('bbox_head.') for g in groups
    ]
    assert len(set(mults)) == 3 and not in_head[0]

    def factor(n):  # LinearLR after n steps
        total = warmup.end - warmup.begin - 1
        start = warmup.start_factor
        return start + (1.0 - start) * min(n, total) / total

    guard = next(h for h in runner.hooks if isinstance(h, NanGuardHook))
    history = guard.history.to_list()
    assert [h['iteration'] for h in history] == list(range(SPIKE_ITER + 1))
    # the explosion check sees the spike in the head's groups
    off = lr_off_schedule(history, SPIKE_ITER)
    assert off['iteration'] == SPIKE_ITER
    assert off['ratio'] == pytest.approx(SPIKE, rel=1e-9)
    assert in_head[off['group']]
    for entry in history:
        n = entry['iteration']
        planned = [base * m * factor(n) for m in mults]
        live = [
            lr * (SPIKE if n == SPIKE_ITER and head else 1.0)
            for lr, head in zip(planned, in_head)
        ]
        assert entry['lrs'] == pytest.approx(live, rel=1e-9)
        assert entry['lrs_scheduled'] == pytest.approx(planned, rel=1e-9)
    assert history[-1]['lr'] == pytest.approx(
        base * mults[off['group']] * factor(SPIKE_ITER) * SPIKE, rel=1e-9
    )
    assert lr_off_schedule(history, SPIKE_ITER - 1)['ratio'] == pytest.approx(
        1.0, rel=1e-9
    )
    # an incident report's lr: the live lr of every group, no base_lr
    assert learning_rates(runner.optim_wrapper) == {
        'lr': [g['lr'] for g in groups]
    }
