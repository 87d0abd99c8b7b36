# Copyright (c) mmnanguard contributors. All rights reserved.
"""Spike detection wired into NanGuardHook, on the toy model: each action,
escalation, AMP, and the false-positive count of a healthy run."""

import glob
import json
import os.path as osp

import pytest
import torch
from mmengine.hooks import Hook
from mmengine.runner import Runner
from mmengine.runner.checkpoint import CheckpointLoader

from mmnanguard.engine.guard.exceptions import TrainingSpikeError
from mmnanguard.engine.hooks import NanGuardHook
from mmnanguard.testing.spike_injection import LossSpikeInjectionHook
from mmnanguard.testing.toy import ToyModel, toy_runner_cfg

SPIKE_AT = 12


class Params(Hook):
    """Parameters and lr before/after each iteration."""

    priority = 'LOWEST'

    def __init__(self):
        self.before, self.after, self.lr = {}, {}, {}

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        self.before[runner.iter] = [
            p.detach().clone() for p in runner.model.parameters()
        ]
        self.lr[runner.iter] = runner.optim_wrapper.get_lr()['lr'][0]

    def after_train_iter(
        self, runner, batch_idx, data_batch=None, outputs=None
    ):
        self.after[runner.iter] = [
            p.detach().clone() for p in runner.model.parameters()
        ]


def run(
    tmp_path,
    spike,
    at=(SPIKE_AT,),
    max_iters=16,
    guard=None,
    factor=100.0,
    **kwargs,
):
    hooks = [dict(type='NanGuardHook', spike=spike, **(guard or {}))]
    torch.manual_seed(0)  # the toy's initial weights
    cfg = toy_runner_cfg(
        str(tmp_path),
        max_iters=max_iters,
        custom_hooks=hooks,
        model=ToyModel(),
        **kwargs,
    )
    # no 2 s pause of mmengine's restarting iterator every 16 iterations
    cfg['train_dataloader']['sampler'] = dict(
        type='InfiniteSampler', shuffle=False
    )
    runner = Runner(**cfg)
    params = Params()
    runner.register_hook(params)
    runner.register_hook(LossSpikeInjectionHook(at, 'loss_a', factor))
    return runner, params


def the_guard(runner):
    return next(h for h in runner.hooks if isinstance(h, NanGuardHook))


def same(xs, ys):
    return all(torch.equal(x, y) for x, y in zip(xs, ys))


def reports(work_dir):
    return [
        json.load(open(p))
        for p in sorted(
            glob.glob(osp.join(str(work_dir), 'nanguard', '*', 'report.json'))
        )
    ]


def spike_events(guard):
    return [
        h['iteration']
        for h in guard.history.to_list()
        if h['event'] == 'spike'
    ]


def test_skip_drops_the_update_and_backs_off(tmp_path):
    runner, params = run(
        tmp_path,
        dict(action='skip', warmup=5),
        guard=dict(lr_backoff=0.5, history_size=100),
    )
    runner.train()
    g = the_guard(runner)
    assert g.counters['spikes'] == 1 and g.counters['skipped'] == 1
    assert g.counters['incidents'] == 1 and g.counters['lr_backoffs'] == 1
    assert same(params.before[SPIKE_AT], params.after[SPIKE_AT])
    assert not same(params.before[SPIKE_AT + 1], params.after[SPIKE_AT + 1])
    assert spike_events(g) == [SPIKE_AT]
    assert params.lr[SPIKE_AT] == 0.01
    assert params.lr[SPIKE_AT + 1] == pytest.approx(0.005)
    assert (
        runner.message_hub.get_scalar('train/nanguard_lr_factor').current()
        == 0.5
    )
    (report,) = reports(tmp_path)
    assert report['kind'] == 'loss_spike' and report['action'] == 'skip'
    assert report['iteration'] == SPIKE_AT and report['local_fault']
    # independent: each quantity against 10 x the max of its earlier values
    hist = {h['iteration']: h for h in report['history']}
    expected = {}
    for name in ('loss', 'loss_a', 'loss_b'):
        reference = max(hist[i]['loss_terms'][name] for i in range(SPIKE_AT))
        value = hist[SPIKE_AT]['loss_terms'][name]
        if value > 10 * reference:
            expected[name] = (value, reference)
    # backward runs on the spiking loss too (the verdict is read before the
    # step), so its gradient norm is checked in the same read
    reference = max(hist[i]['grad_norm'] for i in range(SPIKE_AT))
    if hist[SPIKE_AT]['grad_norm'] > 10 * reference:
        expected['grad_norm'] = (hist[SPIKE_AT]['grad_norm'], reference)
    assert 'loss_a' in expected and 'loss_b' not in expected
    found = {s['name']: (s['value'], s['reference']) for s in report['spikes']}
    assert list(found) == list(expected)
    for name, pair in expected.items():
        assert found[name] == pytest.approx(pair, rel=1e-6)
    assert 'loss_a=' in report['reason']
    ckpt = CheckpointLoader.load_checkpoint(
        osp.join(str(tmp_path), 'iter_16.pth')
    )
    assert ckpt['nanguard']['counters']['spikes'] == 1
    assert len(ckpt['nanguard']['spike']['windows']['loss_a']) == 15
    assert ckpt['nanguard']['lr_backoff']['multiplier'] == 0.5


def test_rollback_restores_the_snapshot(tmp_path):
    runner, params = run(
        tmp_path,
        dict(action='rollback', warmup=5),
        guard=dict(policy='raise', snapshot_interval=4, lr_backoff=0.5),
    )
    runner.train()
    g = the_guard(runner)
    assert g.counters['spikes'] == 1 and g.counters['rollbacks'] == 1
    # last snapshot: start of iteration 12 (taken after iteration 11)
    assert same(params.after[SPIKE_AT], params.before[SPIKE_AT])
    assert same(params.after[SPIKE_AT], params.after[SPIKE_AT - 1])
    assert params.lr[SPIKE_AT + 1] == pytest.approx(0.005)
    assert reports(tmp_path)[0]['action'] == 'rollback'


def test_log_only_records(tmp_path):
    # the run ends with the spike: under 'log' the 100x update is applied
    # and damages the weights for real (the following iterations spike on
    # their own, which 'skip' above prevents)
    runner, params = run(
        tmp_path, dict(action='log', warmup=5), max_iters=SPIKE_AT + 1
    )
    runner.train()
    g = the_guard(runner)
    assert g.counters['spikes'] == 1
    assert g.counters['skipped'] == 0 and g.counters['incidents'] == 0
    assert g.counters['lr_backoffs'] == 0
    assert runner.optim_wrapper.get_lr()['lr'] == [0.01]
    assert not same(params.before[SPIKE_AT], params.after[SPIKE_AT])
    assert spike_events(g) == [SPIKE_AT]
    assert reports(tmp_path) == []
    log = open(glob.glob(osp.join(str(tmp_path), '*', '*.log'))[0]).read()
    assert f'nanguard: spike at iteration {SPIKE_AT} (logged only' in log
    # backward ran on the 100x loss: the grad norm spiked too, one event
    (line,) = [
        x for x in log.splitlines() if f'spike at iteration {SPIKE_AT}' in x
    ]
    assert 'loss_a=' in line and 'grad_norm=' in line


def test_repeated_spikes_escalate(tmp_path):
    runner, _ = run(
        tmp_path,
        dict(action='skip', warmup=5),
        at=(10, 11, 12),
        factor=1000.0,
        guard=dict(max_consecutive_skips=2, escalate_to='raise'),
    )
    with pytest.raises(TrainingSpikeError) as err:
        runner.train()
    assert 'loss_spike at iteration 12' in str(err.value)
    assert 'max_consecutive_skips' in str(err.value)
    assert [r['action'] for r in reports(tmp_path)] == [
        'skip',
        'skip',
        'raise',
    ]


def test_amp_loss_spike_skip_leaves_the_scaler_alone(tmp_path):
    optim = dict(
        type='CPUAmpOptimWrapper',
        dtype='float16',
        optimizer=dict(type='SGD', lr=0.01),
    )
    runner, params = run(
        tmp_path, dict(action='skip', warmup=5), optim_wrapper=optim
    )
    scales = []

    class Scale(Hook):
        def after_train_iter(
            self, runner, batch_idx, data_batch=None, outputs=None
        ):
            scales.append(runner.optim_wrapper.loss_scaler.get_scale())

    runner.register_hook(Scale())
    runner.train()
    g = the_guard(runner)
    assert g.counters['spikes'] == 1 and g.counters['skipped'] == 1
    assert same(params.before[SPIKE_AT], params.after[SPIKE_AT])
    # the dropped update never reached the GradScaler: same scale, and the
    # scaler's own overflow skips (scale decreases) are counted apart
    assert scales[SPIKE_AT] == scales[SPIKE_AT - 1]
    decreases = sum(b < a for a, b in zip([2.0**16] + scales, scales))
    assert g.counters['amp_skipped'] == decreases


def test_no_false_positive_over_200_healthy_toy_iterations(tmp_path):
    runner, _ = run(
        tmp_path,
        dict(action='log'),
        at=(),
        max_iters=200,
        guard=dict(history_size=200),
    )
    runner.train()
    g = the_guard(runner)
    assert g.counters['spikes'] == 0
    assert spike_events(g) == []
    # every quantity was checked (past warmup) on most iterations
    windows = g.spike_detector.windows()
    assert set(windows) == {'loss', 'loss_a', 'loss_b', 'grad_norm'}
    assert all(len(w) == 50 for w in windows.values())
