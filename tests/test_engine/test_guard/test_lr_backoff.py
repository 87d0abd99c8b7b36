# Copyright (c) mmnanguard contributors. All rights reserved.
"""LR backoff and its recovery ramp against mmengine's own schedulers.

Each case runs the real scheduler twice, with and without the backoff, in
the order the runner uses (optimizer step, NanGuardHook.after_train_iter,
ParamSchedulerHook.after_train_iter); the undisturbed twin is the
independent reference.
"""

import pytest
import torch
from mmengine.hooks import Hook
from mmengine.optim import (
    CosineAnnealingLR,
    LinearLR,
    MultiStepLR,
    OneCycleLR,
    OptimWrapper,
)
from mmengine.runner import Runner

from mmnanguard.engine.guard import LrBackoff
from mmnanguard.engine.guard.lr_backoff import NON_CHAINING_SCHEDULERS
from mmnanguard.engine.hooks import NanGuardHook
from mmnanguard.testing.spike_injection import LossSpikeInjectionHook
from mmnanguard.testing.toy import ToyModel, toy_runner_cfg

LR = 0.1
ITERS = 30
AT = 8  # backoff at the end of this iteration

SCHEDULERS = dict(
    linear=lambda o: LinearLR(o, start_factor=0.1, by_epoch=False, end=20),
    multistep=lambda o: MultiStepLR(
        o, milestones=[5, 15], gamma=0.1, by_epoch=False
    ),
    cosine=lambda o: CosineAnnealingLR(
        o, T_max=ITERS, eta_min=0.0, by_epoch=False
    ),
    cosine_eta_min=lambda o: CosineAnnealingLR(
        o, T_max=ITERS, eta_min=1e-2, by_epoch=False
    ),
    onecycle=lambda o: OneCycleLR(
        o, eta_max=LR, total_steps=ITERS + 1, by_epoch=False
    ),
)


def lr_trace(scheduler, backoff=None, at=None):
    """The lr each iteration runs with."""
    torch.manual_seed(0)
    wrapper = OptimWrapper(torch.optim.SGD(ToyModel().parameters(), lr=LR))
    sched = SCHEDULERS[scheduler](wrapper.optimizer)
    lrs = []
    for it in range(ITERS):
        lrs.append(wrapper.optimizer.param_groups[0]['lr'])
        wrapper.optimizer.step()
        if backoff is not None:
            if it == at:
                backoff.back_off(wrapper, it)
            backoff.step(wrapper, it)
        sched.step()
    return lrs


@pytest.mark.parametrize('scheduler', ['linear', 'multistep', 'cosine'])
def test_multiplicative_schedulers_carry_the_backoff(scheduler):
    twin = lr_trace(scheduler)
    backed = lr_trace(scheduler, LrBackoff(0.5), AT)
    assert backed[: AT + 1] == twin[: AT + 1]
    for a, b in zip(backed[AT + 1 :], twin[AT + 1 :]):
        assert a == pytest.approx(0.5 * b, rel=1e-12)


def test_annealing_to_eta_min_scales_the_distance():
    eta = 1e-2
    twin = lr_trace('cosine_eta_min')
    backed = lr_trace('cosine_eta_min', LrBackoff(0.5), AT)
    lr_k = twin[AT + 1]  # the lr the scheduler produced from 0.5 x lr
    # f' fixed at the backoff: distances to eta_min keep the ratio
    ratio = (backed[AT + 1] - eta) / (lr_k - eta)
    for a, b in zip(backed[AT + 1 : -1], twin[AT + 1 : -1]):
        assert (a - eta) == pytest.approx(ratio * (b - eta), rel=1e-9)
    assert 0.4 < ratio < 0.5


def test_onecycle_discards_the_backoff_at_its_next_step():
    twin = lr_trace('onecycle')
    backed = lr_trace('onecycle', LrBackoff(0.5), AT)
    assert backed == pytest.approx(twin, rel=1e-12)
    assert 'OneCycleLR' in NON_CHAINING_SCHEDULERS


@pytest.mark.parametrize('scheduler', ['linear', 'multistep', 'cosine'])
def test_recovery_ramps_back_onto_the_schedule(scheduler):
    twin = lr_trace(scheduler)
    backed = lr_trace(scheduler, LrBackoff(0.5, recover_iters=4), AT)
    ratios = [a / b for a, b in zip(backed, twin)]
    expected = (
        [1.0] * (AT + 1) + [0.5, 0.625, 0.75, 0.875] + [1.0] * (ITERS - AT - 5)
    )
    assert ratios == pytest.approx(expected, rel=1e-12)


def test_recovery_under_eta_min_lands_close_to_the_schedule():
    twin = lr_trace('cosine_eta_min')
    backed = lr_trace('cosine_eta_min', LrBackoff(0.5, recover_iters=4), AT)
    end = AT + 5
    # the ramp also scales eta_min's share: slightly above the schedule,
    # by at most 1.4 %, shrinking as both anneal to eta_min
    gaps = [(a - b) / b for a, b in zip(backed[end:], twin[end:])]
    assert all(0 < g < 0.0145 for g in gaps)
    assert gaps == sorted(gaps, reverse=True) and gaps[-1] < 1e-3


def test_nested_backoff_and_restore():
    torch.manual_seed(0)
    wrapper = OptimWrapper(torch.optim.SGD(ToyModel().parameters(), lr=LR))
    b = LrBackoff(0.5, recover_iters=4)
    b.back_off(wrapper, 0)
    b.step(wrapper, 1)
    b.step(wrapper, 2)  # 0.75
    b.back_off(wrapper, 2)  # 0.375, ramp restarts from there
    assert b.multiplier == 0.375
    assert wrapper.get_lr()['lr'][0] == pytest.approx(LR * 0.375)
    assert b.target(4) == pytest.approx(0.375 + 0.625 * 2 / 4)
    state = b.state_dict()
    c = LrBackoff(0.5, recover_iters=4)
    c.load_state_dict(state)
    assert c.target(5) == b.target(5)
    c.restored(0.75)  # a rollback restored lrs that carried 0.75
    assert c.multiplier == 0.75 and c.target(100) == 0.75


class Lrs(Hook):
    priority = 'LOWEST'

    def __init__(self):
        self.lr = {}

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        self.lr[runner.iter] = runner.optim_wrapper.get_lr()['lr'][0]


def toy_run(tmp_path, spike_at=(), max_iters=16, resume=False, **guard):
    torch.manual_seed(0)
    cfg = toy_runner_cfg(
        str(tmp_path),
        max_iters=max_iters,
        model=ToyModel(),
        resume=resume,
        custom_hooks=[dict(type='NanGuardHook', **guard)],
        param_scheduler=[
            dict(type='LinearLR', start_factor=0.2, by_epoch=False, end=12)
        ],
    )
    cfg['train_dataloader']['sampler'] = dict(
        type='InfiniteSampler', shuffle=False
    )
    runner = Runner(**cfg)
    lrs = Lrs()
    runner.register_hook(lrs)
    runner.register_hook(LossSpikeInjectionHook(spike_at, 'loss_a', 1000.0))
    return runner, lrs


def test_spike_backoff_recovers_in_a_run_and_across_resume(tmp_path):
    spike = dict(action='skip', warmup=5)
    twin, twin_lrs = toy_run(tmp_path / 'twin', spike=spike)
    twin.train()
    runner, lrs = toy_run(
        tmp_path / 'run', spike_at=(7,), spike=spike, recover_iters=4
    )
    runner.train()
    ratios = [lrs.lr[i] / twin_lrs.lr[i] for i in range(16)]
    assert ratios == pytest.approx(
        [1.0] * 8 + [0.5, 0.625, 0.75, 0.875] + [1.0] * 4, rel=1e-12
    )
    g = next(h for h in runner.hooks if isinstance(h, NanGuardHook))
    assert g.counters['spikes'] == 1 and g.counters['lr_backoffs'] == 1
    assert g.lr_backoff.multiplier == 1.0
    # the same run, stopped at 10 (mid-ramp) and resumed, ramps the same
    first, _ = toy_run(
        tmp_path / 'resume',
        spike_at=(7,),
        max_iters=10,
        spike=spike,
        recover_iters=4,
    )
    first.train()
    resumed, resumed_lrs = toy_run(
        tmp_path / 'resume',
        max_iters=16,
        resume=True,
        spike=spike,
        recover_iters=4,
    )
    resumed.train()
    for i in range(10, 16):
        assert resumed_lrs.lr[i] == pytest.approx(lrs.lr[i], rel=1e-12)


def test_rollback_backoff_starts_from_the_restored_lr(tmp_path):
    fault = dict(type='FaultInjectionHook', fault='inf_loss', iteration=6)
    torch.manual_seed(0)
    cfg = toy_runner_cfg(
        str(tmp_path),
        max_iters=10,
        model=ToyModel(),
        custom_hooks=[
            fault,
            dict(
                type='NanGuardHook',
                policy='rollback',
                snapshot_interval=4,
                recover_iters=2,
            ),
        ],
        param_scheduler=[
            dict(type='LinearLR', start_factor=0.2, by_epoch=False, end=12)
        ],
    )
    runner = Runner(**cfg)
    lrs = Lrs()
    runner.register_hook(lrs)
    runner.train()
    # LinearLR(begin=0, end=12) spans 11 steps. The snapshot "start of
    # iteration 4" holds the lr and the scheduler before its step of
    # iteration 3; the rollback at 6 restores them, x0.5, and the scheduler
    # steps: iteration 7 runs with the lr of iteration 4, x0.5; the ramp
    # gives x0.75 for 8 and the schedule for 9
    sched = [0.01 * (0.2 + 0.8 * i / 11) for i in range(12)]
    assert [lrs.lr[i] for i in range(7)] == pytest.approx(sched[:7], rel=1e-9)
    assert lrs.lr[7] == pytest.approx(0.5 * sched[4], rel=1e-9)
    assert lrs.lr[8] == pytest.approx(0.75 * sched[5], rel=1e-9)
    assert lrs.lr[9] == pytest.approx(sched[6], rel=1e-9)
