# Copyright (c) mmnanguard contributors. All rights reserved.
"""A dropped step's loss, loss terms and grad_norm never reach the smoothed
log: the units on a real MessageHub, then the real Runner on the tiny
rotated RetinaNet (its upstream ``clip_grad`` logs ``grad_norm``) with
mmdet's default ``log_processor`` (``window_size=50``), a planted fault,
and every later line of the text log, ``scalars.json`` and TensorBoard
checked against the mean of the kept iterations' values."""

import glob
import json
import math
import os.path as osp
import re
import uuid
from types import SimpleNamespace

import pytest
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.logging import MessageHub, MMLogger
from mmengine.runner import Runner

from mmnanguard.analysis.config_path import resolve_config_path
from mmnanguard.engine.guard import DroppedStepScalars, IterationOutcome
from mmnanguard.engine.guard.verdict import StepVerdict
from mmnanguard.testing import TINY_DOTA_CONFIG, load_tiny_config

INF = math.inf


# -- units on a real MessageHub ---------------------------------------------
def _runner(iteration=0):
    name = f'dropped_{uuid.uuid4().hex[:8]}'
    return SimpleNamespace(
        message_hub=MessageHub.get_instance(name),
        logger=MMLogger.get_instance(name),
        iter=iteration,
    )


def _outcome(step='taken', verdicts=1):
    """An outcome with ``verdicts`` decided steps: taken, dropped by the
    guard (``skipped``) or by the GradScaler (``amp``); none: an
    accumulation iteration."""
    outcome = IterationOutcome(
        verdicts=[StepVerdict(iteration=0) for _ in range(verdicts)]
    )
    if verdicts:
        outcome.steps = verdicts if step == 'taken' else 0
        outcome.skipped = verdicts if step == 'skipped' else 0
        outcome.amp_skipped = verdicts if step == 'amp' else 0
    return outcome


def _iteration(filter_, runner, loss, grad_norm, step='taken', verdicts=1):
    """What mmengine writes in one iteration, then the filter."""
    hub = runner.message_hub
    if grad_norm is not None:
        hub.update_scalar('train/grad_norm', grad_norm)
    hub.update_scalars({'train/loss': loss, 'train/loss_a': loss / 2})
    removed = filter_.after_iteration(
        runner, _outcome(step, verdicts), dict(loss=loss, loss_a=loss / 2)
    )
    runner.iter += 1
    return removed


def _values(runner, key):
    buffer = runner.message_hub.log_scalars.get(key)
    return None if buffer is None else buffer.data[0].tolist()


def test_a_skipped_step_leaves_no_value_and_the_means_are_of_the_kept():
    runner, filter_ = _runner(), DroppedStepScalars()
    _iteration(filter_, runner, 1.0, 3.0)
    _iteration(filter_, runner, 2.0, 5.0)
    removed = _iteration(filter_, runner, INF, math.nan, 'skipped')
    _iteration(filter_, runner, 4.0, 7.0)
    assert removed == ['loss', 'loss_a', 'grad_norm']
    assert _values(runner, 'train/loss') == [1.0, 2.0, 4.0]
    assert _values(runner, 'train/loss_a') == [0.5, 1.0, 2.0]
    assert _values(runner, 'train/grad_norm') == [3.0, 5.0, 7.0]
    buffer = runner.message_hub.get_scalar('train/loss')
    assert buffer.mean(50) == pytest.approx(7.0 / 3)
    assert buffer.max_length == 1000000  # mmengine's default, kept


def test_a_first_step_dropped_removes_the_scalar_until_it_returns():
    # a mean over an empty buffer would be 0/0: the key goes instead
    runner, filter_ = _runner(), DroppedStepScalars()
    _iteration(filter_, runner, INF, INF, 'skipped')
    assert _values(runner, 'train/loss') is None
    assert _values(runner, 'train/grad_norm') is None
    _iteration(filter_, runner, 2.0, 5.0)
    assert _values(runner, 'train/loss') == [2.0]
    assert _values(runner, 'train/grad_norm') == [5.0]


def test_accumulation_drops_every_micro_batch_of_the_dropped_step():
    # accumulative_counts=3: two iterations without a step (no verdict, no
    # grad_norm), then the step, dropped for the inf of the first
    runner, filter_ = _runner(), DroppedStepScalars()
    _iteration(filter_, runner, 1.0, 3.0)  # a whole taken step
    _iteration(filter_, runner, INF, None, verdicts=0)
    _iteration(filter_, runner, 2.0, None, verdicts=0)
    _iteration(filter_, runner, 3.0, 9.0, 'skipped')
    assert _values(runner, 'train/loss') == [1.0]
    assert _values(runner, 'train/grad_norm') == [3.0]


def test_history_from_before_a_resume_is_kept():
    # a resumed hub holds values the filter never saw: only the dropped
    # iteration's are removed
    runner, filter_ = _runner(10), DroppedStepScalars()
    for value in (1.0, 2.0):
        runner.message_hub.update_scalar('train/loss', value)
        runner.message_hub.update_scalar('train/loss_a', value / 2)
        runner.message_hub.update_scalar('train/grad_norm', value)
    _iteration(filter_, runner, INF, INF, 'skipped')
    assert _values(runner, 'train/loss') == [1.0, 2.0]
    assert _values(runner, 'train/grad_norm') == [1.0, 2.0]


def test_a_gradscaler_skip_is_left_out_without_a_log_line(capsys):
    runner, filter_ = _runner(), DroppedStepScalars()
    _iteration(filter_, runner, 1.0, 3.0)
    assert _iteration(filter_, runner, 2.0, INF, 'amp') == [
        'loss',
        'loss_a',
        'grad_norm',
    ]
    assert _values(runner, 'train/grad_norm') == [3.0]
    assert 'left out of the logged means' not in capsys.readouterr().out


# -- the real Runner on a tiny upstream config ----------------------------
MAX_ITERS = 6
FAULT_ITER = 2
TERMS = ('loss', 'loss_cls', 'loss_bbox', 'grad_norm')


class RawScalars(Hook):
    """Each iteration's own values, before any hook smooths or filters
    them: the model's ``log_vars`` from ``outputs``, and ``grad_norm`` as
    the optim wrapper wrote it during the step."""

    priority = 'HIGHEST'  # before RuntimeInfoHook and NanGuardHook

    def __init__(self):
        self.values = {}

    def after_train_iter(
        self, runner, batch_idx, data_batch=None, outputs=None
    ):
        row = {k: float(v.detach()) for k, v in outputs.items()}
        row['grad_norm'] = float(
            runner.message_hub.get_scalar('train/grad_norm').current()
        )
        self.values[runner.iter] = row


def _upstream_log_processor():
    runtime = Config.fromfile(
        resolve_config_path('mmdet::_base_/default_runtime.py')
    )
    assert runtime.log_processor.window_size == 50 > MAX_ITERS
    return runtime.log_processor.to_dict()


def _run(tmp_path, data_root, fault, policy):
    probe = RawScalars()
    cfg = load_tiny_config(
        TINY_DOTA_CONFIG,
        str(tmp_path),
        data_root,
        max_iters=MAX_ITERS,
        custom_hooks=[
            dict(type='FaultInjectionHook', fault=fault, iteration=FAULT_ITER),
            dict(type='NanGuardHook', policy=policy, snapshot_interval=1),
        ],
    )
    cfg.log_processor = dict(_upstream_log_processor(), by_epoch=False)
    cfg.visualizer.name = f'vis_{uuid.uuid4().hex[:8]}'
    cfg.visualizer.vis_backends = [
        dict(type='LocalVisBackend'),
        dict(type='TensorboardVisBackend'),
    ]
    runner = Runner.from_cfg(cfg)
    runner.register_hook(probe)
    runner.train()
    return runner, probe.values


def _kept_means(values):
    """Per iteration: the mean of each term over the kept iterations so far
    (the window of 50 holds them all)."""
    means = {}
    for it in range(MAX_ITERS):
        kept = [values[j] for j in range(it + 1) if j != FAULT_ITER]
        means[it] = {
            term: sum(row[term] for row in kept) / len(kept) for term in TERMS
        }
    return means


def _text_log(runner):
    (path,) = glob.glob(osp.join(runner.log_dir, '*.log'))
    lines = {}
    with open(path) as f:
        for line in f:
            found = re.search(r'Iter\(train\) \[\s*(\d+)/\d+\]', line)
            if found:
                items = dict(re.findall(r'(\w+): (\S+)', line))
                lines[int(found.group(1)) - 1] = items
    return lines


def _scalars_json(runner):
    (path,) = glob.glob(osp.join(runner.log_dir, 'vis_data', 'scalars.json'))
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    return {row['step'] - 1: row for row in rows}


def _tensorboard(runner):
    from tensorboard.backend.event_processing.event_accumulator import (
        EventAccumulator,
    )

    events = EventAccumulator(osp.join(runner.log_dir, 'vis_data'))
    events.Reload()
    return {
        term: {e.step - 1: e.value for e in events.Scalars(term)}
        for term in TERMS
    }


@pytest.mark.slow
@pytest.mark.parametrize(
    'fault, policy, counter',
    [('inf_loss', 'skip', 'skipped'), ('nan_grad', 'rollback', 'rollbacks')],
)
def test_every_line_after_a_dropped_step_is_the_mean_of_the_kept(
    tmp_path, tiny_dota_root, fault, policy, counter
):
    runner, values = _run(tmp_path, tiny_dota_root, fault, policy)
    planted = values[FAULT_ITER]
    if fault == 'inf_loss':
        assert planted['loss'] == INF and planted['loss_cls'] == INF
    else:  # a finite loss, a NaN gradient: grad_norm is what reached the log
        assert math.isnan(planted['grad_norm'])
        assert 'loss_fault_sqrt' in planted
    expected = _kept_means(values)
    text, scalars, board = (
        _text_log(runner),
        _scalars_json(runner),
        _tensorboard(runner),
    )
    assert sorted(text) == sorted(scalars) == list(range(MAX_ITERS))
    for it in range(MAX_ITERS):
        for term in TERMS:
            want = expected[it][term]
            assert math.isfinite(want)
            # the text log prints 4 decimals (LogProcessor num_digits)
            assert float(text[it][term]) == pytest.approx(want, abs=5.1e-5)
            assert scalars[it][term] == pytest.approx(want, rel=1e-6)
            assert board[term][it] == pytest.approx(want, rel=1e-6)
        # the planted term of the dropped step never reaches a line
        assert 'loss_fault_sqrt' not in text[it]
        assert 'loss_fault_sqrt' not in scalars[it]
        assert int(text[it][f'nanguard_{counter}']) == (it >= FAULT_ITER)
    log = open(glob.glob(osp.join(runner.log_dir, '*.log'))[0]).read()
    assert (
        f'nanguard: the step of iteration {FAULT_ITER} was dropped; its '
        in log
    )
