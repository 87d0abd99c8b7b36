# Copyright (c) mmnanguard contributors. All rights reserved.
"""Recovery restores exactly, on the real rotated RTMDet-tiny config.

The config keeps its upstream ``EMAHook`` (``ExpMomentumEMA``), AdamW (two
moments per parameter) and its warmup + cosine schedule, and trains under
bf16 CPU autocast with a real dynamic GradScaler (``CPUAmpOptimWrapper``;
fp16 convolutions run about 50x slower on the CPU). A witness
hook copies the whole training state right after the guard's
``after_train_iter`` every iteration, i.e. at the point where the guard
takes its snapshots and where it restores them. The snapshot a rollback
restores (``NanGuardHook.last_restored``) must equal, bit for bit, the
witness copy of the iteration it was taken in; the state right after the
rollback must equal the same copy (the learning rates times
``lr_backoff``, computed in float like the backoff).
"""

import copy
import os.path as osp

import pytest
import torch
from mmengine.hooks import Hook
from mmengine.runner import Runner

from mmnanguard.engine import NonFiniteTrainingError
from mmnanguard.engine.guard.snapshot import ema_hooks, scheduler_states
from mmnanguard.engine.hooks import NanGuardHook
from mmnanguard.testing import load_tiny_config
from mmnanguard.testing.tiny_configs import MIM_ROOT

RTMDET = osp.join(
    MIM_ROOT, 'configs', 'tiny', 'rotated-rtmdet_tiny_tiny-dota.py'
)
BACKOFF = 0.5


def state_of(runner):
    """Deep copies of model, optimizer (with GradScaler), schedulers, EMA."""
    return dict(
        model=copy.deepcopy(runner.model.state_dict()),
        optimizer=copy.deepcopy(runner.optim_wrapper.state_dict()),
        schedulers=copy.deepcopy(scheduler_states(runner)),
        ema=[
            copy.deepcopy(h.ema_model.state_dict()) for h in ema_hooks(runner)
        ],
    )


def snapshot_state(snapshot):
    return dict(
        model=snapshot.model,
        optimizer=snapshot.optimizer,
        schedulers=snapshot.schedulers,
        ema=snapshot.ema,
    )


class Witness(Hook):
    """Copies the state after the guard (ABOVE_NORMAL, 40) and before
    ``EMAHook`` (49) and ``ParamSchedulerHook`` (LOW) every iteration."""

    priority = 45

    def __init__(self):
        self.states = {}

    def after_train_iter(
        self, runner, batch_idx, data_batch=None, outputs=None
    ):
        self.states[runner.iter] = state_of(runner)


def assert_same(a, b, path=''):
    """Bit-for-bit equality of nested states (NaN payloads included)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), path
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert torch.equal(
            a.view(-1).view(torch.uint8), b.view(-1).view(torch.uint8)
        ), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), (path, set(a) ^ set(b))
        for key in a:
            assert_same(a[key], b[key], f'{path}.{key}')
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f'{path}[{i}]')
    else:
        assert a == b, (path, a, b)


def split_lrs(optimizer_state):
    """The optimizer state without the param groups' lrs, and the lrs."""
    state = copy.deepcopy(optimizer_state)
    return state, [group.pop('lr') for group in state['param_groups']]


def train(work_dir, data_root, guard, fault, max_iters):
    cfg = load_tiny_config(RTMDET, work_dir, data_root, max_iters=max_iters)
    cfg.optim_wrapper.type = 'CPUAmpOptimWrapper'
    cfg.optim_wrapper.dtype = 'bfloat16'  # fp16 convolutions: 50x slower
    cfg.custom_hooks = list(cfg.custom_hooks) + [
        dict(type='NanGuardHook', **guard),
        dict(type='FaultInjectionHook', **fault),
    ]
    cfg.default_hooks.checkpoint = dict(
        type='CheckpointHook', interval=10**6, by_epoch=False
    )
    runner = Runner.from_cfg(cfg)
    witness = Witness()
    runner.register_hook(witness)
    hook = next(h for h in runner.hooks if isinstance(h, NanGuardHook))
    checks = []  # iterations whose step queued a parameter check

    class Checks(Hook):
        priority = 'LOWEST'

        def after_train_iter(
            self, run, batch_idx, data_batch=None, outputs=None
        ):
            queued = hook.step_guard.params_check.pending
            if queued is not None:
                checks.append(queued)

    runner.register_hook(Checks())
    error = None
    try:
        runner.train()
    except NonFiniteTrainingError as err:
        error = err
    return runner, hook, witness, error, checks


@pytest.fixture(scope='module')
def rollback_run(tmp_path_factory, tiny_dota_root):
    """Parameter checks every 4 iterations, snapshots every 2, NaN written
    into AdamW's first moment at iteration 5: the step of iteration 5 makes
    a weight NaN; the snapshot due after it queues a parameter check, read
    with iteration 6's step, which drops the pending snapshot and the step:
    rollback to the snapshot of iteration 4."""
    return train(
        str(tmp_path_factory.mktemp('rollback')),
        tiny_dota_root,
        guard=dict(
            policy='rollback',
            lr_backoff=BACKOFF,
            snapshot_interval=2,
            param_check_interval=4,
        ),
        fault=dict(fault='nan_optimizer_state', iteration=5),
        max_iters=8,
    )


@pytest.mark.slow
def test_rollback_restores_every_state_bit_for_bit(rollback_run):
    runner, hook, witness, error, _ = rollback_run
    assert error is None and hook.counters['rollbacks'] == 1
    restored = hook.last_restored
    assert restored.iteration == 4
    # the snapshot for iteration 4 is the state at the end of iteration 3
    taken = witness.states[3]
    assert_same(snapshot_state(restored), taken)
    after = witness.states[6]  # right after the rollback
    assert_same(after['model'], taken['model'])
    assert_same(after['ema'], taken['ema'])
    assert_same(after['schedulers'], taken['schedulers'])
    state, lrs = split_lrs(after['optimizer'])
    taken_state, taken_lrs = split_lrs(taken['optimizer'])
    assert_same(state, taken_state)  # AdamW moments, steps, GradScaler
    assert lrs == [lr * BACKOFF for lr in taken_lrs]


@pytest.mark.slow
def test_the_restored_states_had_changed_since_the_snapshot(rollback_run):
    # not a vacuous equality: iterations 4 and 5 changed every part
    _, _, witness, _, _ = rollback_run
    taken, bad = witness.states[3], witness.states[5]
    first = next(iter(taken['model']))
    assert not torch.isfinite(bad['model'][first]).all()  # the NaN weight
    ema_key = f'module.{first}'
    assert not torch.equal(bad['ema'][0][ema_key], taken['ema'][0][ema_key])
    scaler = taken['optimizer']['loss_scaler']
    assert bad['optimizer']['loss_scaler'] != scaler
    assert bad['schedulers'][0]['last_step'] == (
        taken['schedulers'][0]['last_step'] + 2
    )
    moment = taken['optimizer']['state'][1]['exp_avg']
    assert not torch.equal(bad['optimizer']['state'][1]['exp_avg'], moment)


@pytest.mark.slow
def test_param_checks_and_snapshot_shortcut(rollback_run):
    _, hook, _, _, checks = rollback_run
    # a check is queued after the steps of iterations 3 and 7
    # (param_check_interval=4) and 1 and 5 (a snapshot is due after them);
    # each is read with the next step's verdict, no pass of its own; the
    # one of iteration 7 is read before the last checkpoint is written
    # (the checkpoint hook runs before this witness)
    assert checks == [1, 3, 5]
    report = hook.last_report
    assert (report['kind'], report['iteration']) == ('nonfinite_params', 5)
    assert report['detected_at'] == 6
    assert [s.iteration for s in hook.snapshots] == [4, 8]
    assert all(
        torch.isfinite(t).all()
        for s in hook.snapshots
        for t in s.model.values()
        if t.is_floating_point()
    )


@pytest.mark.slow
def test_raise_after_a_poisoned_step_leaves_the_last_snapshot(
    tmp_path, tiny_dota_root
):
    runner, hook, witness, error, _ = train(
        str(tmp_path),
        tiny_dota_root,
        guard=dict(policy='raise', snapshot_interval=2),
        fault=dict(fault='nan_optimizer_state', iteration=3),
        max_iters=5,
    )
    assert error is not None
    assert 'restored to iteration 2' in str(error)
    assert hook.last_report['kind'] == 'nonfinite_params'
    assert hook.last_report['iteration'] == 3
    assert hook.last_restored.iteration == 2
    # the check of step 3 is read with the step of iteration 4, which the
    # guard drops before raising
    assert 3 in witness.states and 4 not in witness.states
    taken = witness.states[1]
    assert_same(runner.model.state_dict(), taken['model'])
    assert_same(runner.optim_wrapper.state_dict(), taken['optimizer'])
