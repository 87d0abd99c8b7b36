# Copyright (c) mmnanguard contributors. All rights reserved.
"""SIGTERM / SIGINT in a protected run: a checkpoint at the next iteration
boundary, ``TrainingPreempted``, the previous handlers restored, and a
resume that continues from there (toy runs; the tiny real config in
``tests/test_integration/test_crash_survival.py``)."""

import os
import os.path as osp
import signal

import pytest
from mmengine.hooks import Hook

from mmnanguard.compat.checkpoint_allowlist import load_from_local
from mmnanguard.engine.runner import (
    EXIT_PREEMPTED,
    NanGuardRunner,
    PreemptionHook,
    TrainingPreempted,
)
from mmnanguard.engine.runner.preemption import PreemptionSignals
from mmnanguard.testing.toy import ToyDataset, toy_runner_cfg

PROTECTION = dict(
    policy='skip', hooks=[], check_labels=False, validate_annotations=None
)


class SignalAt(Hook):
    """Sends ``signum`` to this process during iteration ``at``
    (1-based), or with ``late`` in ``after_train_iter``, after the
    ``PreemptionHook`` (same priority, registered later)."""

    priority = 'LOWEST'

    def __init__(self, at, signum=signal.SIGTERM, late=False):
        self.at, self.signum, self.late = at, signum, late
        self.starts = []

    def before_train(self, runner):
        self.starts.append((runner.epoch, runner.iter))

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        if not self.late and runner.iter + 1 == self.at:
            os.kill(os.getpid(), self.signum)

    def after_train_iter(
        self, runner, batch_idx, data_batch=None, outputs=None
    ):
        if self.late and runner.iter + 1 == self.at:
            os.kill(os.getpid(), self.signum)


def toy_runner(work_dir, probe=None, by_epoch=False, **kwargs):
    if by_epoch:
        kwargs.setdefault('train_cfg', dict(by_epoch=True, max_epochs=2))
        kwargs['train_dataloader'] = dict(
            dataset=ToyDataset(n=8),  # 4 iterations an epoch
            sampler=dict(type='DefaultSampler', shuffle=False),
            collate_fn=dict(type='default_collate'),
            batch_size=2,
            num_workers=0,
        )
        kwargs['log_processor'] = dict(by_epoch=True, window_size=1)
    cfg = toy_runner_cfg(
        str(work_dir),
        nanguard=PROTECTION,
        custom_hooks=[probe] if probe else [],
        **kwargs,
    )
    cfg['default_hooks']['checkpoint'] = dict(
        type='CheckpointHook',
        interval=100 if not by_epoch else 1,
        by_epoch=by_epoch,
    )
    return NanGuardRunner(**cfg)


def meta_of(path):
    meta = load_from_local(path, map_location='cpu')['meta']
    return meta['epoch'], meta['iter']


def test_preemption_hook_stages():
    hook = PreemptionHook(PreemptionSignals())
    assert hook.priority == 'LOWEST'
    assert sorted(hook.get_triggered_stages()) == [
        'after_train_epoch',
        'after_train_iter',
        'before_train',
    ]
    assert EXIT_PREEMPTED == 4


def test_second_signal_runs_the_previous_handler():
    calls = []
    previous = signal.signal(signal.SIGTERM, lambda *a: calls.append(a[0]))
    try:
        signals = PreemptionSignals()
        assert signals.install()
        os.kill(os.getpid(), signal.SIGTERM)
        assert signals.received == signal.SIGTERM and calls == []
        assert signals.signal_name == 'SIGTERM'
        os.kill(os.getpid(), signal.SIGTERM)  # the second: as before
        assert calls == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGTERM) is not signals._handle
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGINT])
def test_signal_saves_at_the_next_boundary_then_resume(tmp_path, signum):
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    probe = SignalAt(3, signum)
    runner = toy_runner(tmp_path, probe, max_iters=6)
    with pytest.raises(TrainingPreempted) as info:
        runner.train()
    err = info.value
    path = osp.join(str(tmp_path), 'iter_3.pth')
    assert err.checkpoint == path and err.iteration == 3
    assert err.signal_name == signal.Signals(signum).name
    assert str(err).startswith(f'nanguard: {err.signal_name} received')
    assert path in str(err) and '--resume' in str(err)
    # checkpoints every 100 iterations: only the preemption save exists
    assert sorted(n for n in os.listdir(tmp_path) if n.endswith('.pth')) == [
        'iter_3.pth'
    ]
    assert meta_of(path) == (0, 3)
    with open(osp.join(str(tmp_path), 'last_checkpoint')) as f:
        assert f.read() == path
    after = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    assert after == before

    resumed_probe = SignalAt(at=-1)
    resumed = toy_runner(tmp_path, resumed_probe, max_iters=6, resume=True)
    resumed.train()
    assert resumed_probe.starts == [(0, 3)] and resumed.iter == 6


def test_signal_after_the_last_iteration_changes_nothing(tmp_path):
    probe = SignalAt(4, late=True)
    runner = toy_runner(tmp_path, probe, max_iters=4)
    runner.train()  # the PreemptionHook had already looked
    assert runner.iter == 4
    # only CheckpointHook's save_last checkpoint; no preemption save
    names = [n for n in os.listdir(tmp_path) if n.endswith('.pth')]
    assert names == ['iter_4.pth']


def test_epoch_loop_mid_epoch_resumes_at_the_next_batch(tmp_path):
    probe = SignalAt(2)  # the second of 4 iterations of epoch 1
    runner = toy_runner(tmp_path, probe, by_epoch=True)
    with pytest.raises(TrainingPreempted) as info:
        runner.train()
    assert osp.basename(info.value.checkpoint) == 'iter_2.pth'
    assert meta_of(info.value.checkpoint) == (0, 2)
    resumed_probe = SignalAt(at=-1)
    resumed = toy_runner(tmp_path, resumed_probe, by_epoch=True, resume=True)
    resumed.train()
    # the unfinished epoch goes on at its third batch (bare mmengine
    # repeats it from its first and ends at iteration 10): the iteration
    # count ends where an uninterrupted run's does
    assert resumed_probe.starts == [(0, 2)]
    assert (resumed.epoch, resumed.iter) == (2, 8)


def test_epoch_loop_last_iteration_is_the_epoch_end(tmp_path):
    probe = SignalAt(4)  # the last iteration of epoch 1
    runner = toy_runner(tmp_path, probe, by_epoch=True)
    with pytest.raises(TrainingPreempted) as info:
        runner.train()
    # CheckpointHook saved epoch_1.pth at this boundary: named, not redone
    assert osp.basename(info.value.checkpoint) == 'epoch_1.pth'
    assert info.value.iteration == 4
    assert meta_of(info.value.checkpoint) == (1, 4)
    names = sorted(n for n in os.listdir(tmp_path) if n.endswith('.pth'))
    assert names == ['epoch_1.pth']
    resumed_probe = SignalAt(at=-1)
    resumed = toy_runner(tmp_path, resumed_probe, by_epoch=True, resume=True)
    resumed.train()
    assert resumed_probe.starts == [(1, 4)]
    assert (resumed.epoch, resumed.iter) == (2, 8)
