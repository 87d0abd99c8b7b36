# Copyright (c) mmnanguard contributors. All rights reserved.
"""The lr backoff under a scheduler hook that sets the lr itself.

mmyolo's ``YOLOv5ParamSchedulerHook`` (a ``ParamSchedulerHook`` subclass,
priority 9) caches every group's lr in ``before_train`` and, during its
warmup, sets ``group['lr'] = base * f(iteration)`` in every
``before_train_iter``: a backoff written into the param groups is gone by
the next step. :class:`WarmupFromBaseHook` below does exactly that (mmyolo
is not installed in this stack). The guard must re-apply its backoff on
top of what the hook sets, before each step, and say so naming the hook.
The expected lrs are computed from the hook's formula.
"""

import glob
import os.path as osp

import pytest
from mmengine.hooks import Hook, ParamSchedulerHook
from mmengine.runner import Runner

from mmnanguard.engine.hooks import NanGuardHook
from mmnanguard.testing.toy import ToyModel, toy_runner_cfg

LR = 0.01
WARMUP = 20
MAX_ITERS = 10
#: the toy model's params: a.weight, a.bias, b.weight, b.bias
LR_MULT = dict(a=1.0, b=10.0)


class WarmupFromBaseHook(ParamSchedulerHook):
    """Sets every lr from the values cached before training, each
    iteration (as mmyolo's ``YOLOv5ParamSchedulerHook`` warms up)."""

    priority = 9

    def before_train(self, runner):
        groups = runner.optim_wrapper.optimizer.param_groups
        self.base = [g.setdefault('initial_lr', g['lr']) for g in groups]

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        groups = runner.optim_wrapper.optimizer.param_groups
        for base, group in zip(self.base, groups):
            group['lr'] = base * (runner.iter + 1) / WARMUP


class LrInStep(Hook):
    """The lr of every param group in each step (read right after it)."""

    priority = 'VERY_HIGH'

    def __init__(self):
        self.lrs = {}

    def after_train_iter(
        self, runner, batch_idx, data_batch=None, outputs=None
    ):
        groups = runner.optim_wrapper.optimizer.param_groups
        self.lrs[runner.iter] = [g['lr'] for g in groups]


def warmup_lrs(iteration):
    """The hook's lrs: a.weight, a.bias, b.weight, b.bias."""
    f = (iteration + 1) / WARMUP
    return [LR * LR_MULT[k] * f for k in ('a', 'a', 'b', 'b')]


def test_backoff_is_reapplied_after_a_hook_that_resets_the_lr(tmp_path):
    in_step = LrInStep()
    hooks = [
        dict(type='FaultInjectionHook', fault='inf_loss', iteration=3),
        dict(type='FaultInjectionHook', fault='inf_loss', iteration=6),
        dict(
            type='NanGuardHook',
            policy='rollback',
            snapshot_interval=2,
            lr_backoff=0.5,
        ),
        WarmupFromBaseHook(),
        in_step,
    ]
    optim_wrapper = dict(
        type='OptimWrapper',
        optimizer=dict(type='SGD', lr=LR, momentum=0.9),
        paramwise_cfg=dict(custom_keys={'b.': dict(lr_mult=LR_MULT['b'])}),
    )
    runner = Runner(
        **toy_runner_cfg(
            str(tmp_path),
            max_iters=MAX_ITERS,
            custom_hooks=hooks,
            optim_wrapper=optim_wrapper,
        )
    )
    runner.train()
    guard = next(h for h in runner.hooks if isinstance(h, NanGuardHook))
    assert guard.counters['rollbacks'] == 2
    assert len(in_step.lrs[0]) == 4  # one group per parameter
    # before the first rollback (end of iteration 3): the hook's values
    for it in range(0, 4):
        assert in_step.lrs[it] == pytest.approx(warmup_lrs(it), rel=1e-12)
    # after it: x0.5 on top of what the hook sets; after the second x0.25
    for it in range(4, 7):
        expected = [0.5 * lr for lr in warmup_lrs(it)]
        assert in_step.lrs[it] == pytest.approx(expected, rel=1e-12)
    for it in range(7, MAX_ITERS):
        expected = [0.25 * lr for lr in warmup_lrs(it)]
        assert in_step.lrs[it] == pytest.approx(expected, rel=1e-12)
    # the history holds the live lr of every group; no schedule is known
    # (the hook sets the lr, there is no param scheduler)
    entry = guard.history.to_list()[-1]
    assert entry['lrs'] == pytest.approx(in_step.lrs[MAX_ITERS - 1])
    assert entry['lrs_scheduled'] == [None] * 4
    log = open(glob.glob(osp.join(str(tmp_path), '*', '*.log'))[0]).read()
    assert (
        'nanguard: WarmupFromBaseHook sets the lr from its own stored '
        'values' in log
    )
    reset = 'was reset by WarmupFromBaseHook'
    assert log.count(reset) == 2  # once per backoff
    assert 'x0.5 of what it sets' in log and 'x0.25 of what it sets' in log


def test_backoff_with_a_chaining_scheduler_is_not_applied_twice(tmp_path):
    """An mmengine scheduler continues from the backed-off lr: the guard
    must not take its step for a reset (the backoff stays x0.5, not
    x0.25). LinearLR's values are computed by hand."""
    in_step = LrInStep()
    hooks = [
        dict(type='FaultInjectionHook', fault='inf_loss', iteration=3),
        dict(type='NanGuardHook', policy='rollback', snapshot_interval=2),
        in_step,
    ]
    runner = Runner(
        **toy_runner_cfg(
            str(tmp_path),
            max_iters=MAX_ITERS,
            custom_hooks=hooks,
            param_scheduler=[
                dict(
                    type='LinearLR',
                    start_factor=0.1,
                    by_epoch=False,
                    begin=0,
                    end=WARMUP,
                )
            ],
        )
    )
    runner.train()

    def linear(n):  # LinearLR after n steps
        return LR * (0.1 + 0.9 * min(n, WARMUP - 1) / (WARMUP - 1))

    # the rollback at the end of iteration 3 restores the snapshot taken
    # after the step of iteration 1, before the scheduler's (n = 1), times
    # 0.5; the scheduler then steps once per iteration from there
    assert in_step.lrs[3] == pytest.approx([linear(3)], rel=1e-12)
    for it in range(4, MAX_ITERS):
        expected = [0.5 * linear(it - 2)]
        assert in_step.lrs[it] == pytest.approx(expected, rel=1e-9)
    log = open(glob.glob(osp.join(str(tmp_path), '*', '*.log'))[0]).read()
    assert 'was reset by' not in log


class LrInTrainStep(ToyModel):
    """Sets the lr inside ``train_step``, after every hook has run (as
    custom training code can): nothing can put the backoff back there."""

    def train_step(self, data, optim_wrapper):
        for group in optim_wrapper.optimizer.param_groups:
            group['lr'] = LR
        return super().train_step(data, optim_wrapper)


def test_a_backoff_lost_inside_the_step_is_reported(tmp_path):
    in_step = LrInStep()
    hooks = [
        dict(type='FaultInjectionHook', fault='inf_loss', iteration=3),
        dict(type='NanGuardHook', policy='rollback', snapshot_interval=2),
        in_step,
    ]
    runner = Runner(
        **toy_runner_cfg(
            str(tmp_path),
            max_iters=6,
            custom_hooks=hooks,
            model=LrInTrainStep(),
        )
    )
    runner.train()
    assert in_step.lrs[4] == [LR]  # the step did not use the backoff
    log = open(glob.glob(osp.join(str(tmp_path), '*', '*.log'))[0]).read()
    assert (
        'the step of iteration 4 did not use the lr backoff x0.5; '
        'nanguard cannot enforce it there' in log
    )
    assert log.count('did not use the lr backoff') == 1
