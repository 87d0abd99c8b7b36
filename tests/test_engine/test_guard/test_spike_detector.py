# Copyright (c) mmnanguard contributors. All rights reserved.
"""SpikeDetector and SpikeSettings against hand calculations."""

import math

import pytest
import torch
from mmengine.runner import Runner

from mmnanguard.engine.guard import (
    GuardSettings,
    IterationRecord,
    SpikeDetector,
    SpikeSettings,
)
from mmnanguard.testing.toy import toy_runner_cfg


def detector(**kwargs):
    kwargs.setdefault('warmup', 3)
    kwargs.setdefault('window', 4)
    return SpikeDetector(SpikeSettings(**kwargs))


@pytest.mark.parametrize(
    'spike, key',
    [
        (dict(action='raise'), 'spike.action'),
        (dict(factor=1.0), 'spike.factor'),
        (dict(factor=float('nan')), 'spike.factor'),
        (dict(factor=float('inf')), 'spike.factor'),
        (dict(factor='10'), 'spike.factor'),
        (dict(window=0), 'spike.window'),
        (dict(warmup=0), 'spike.warmup'),
        (dict(warmup=60, window=50), 'spike.warmup'),
        (dict(min_value=-1.0), 'spike.min_value'),
        (dict(keys='loss_cls'), 'spike.keys'),
        (dict(grad_norm=1), 'spike.grad_norm'),
        (dict(backoff='yes'), 'spike.backoff'),
        (dict(factr=10), 'factr'),
        ('skip', 'spike'),
    ],
)
def test_bad_spike_settings_fail_when_runner_is_built(tmp_path, spike, key):
    with pytest.raises((ValueError, TypeError)) as err:
        Runner(
            **toy_runner_cfg(
                str(tmp_path),
                custom_hooks=[dict(type='NanGuardHook', spike=spike)],
            )
        )
    assert key in str(err.value)


@pytest.mark.parametrize('value', [-1, 1.5, 'ten'])
def test_bad_recover_iters(value):
    with pytest.raises(ValueError, match='recover_iters'):
        GuardSettings.from_dict(dict(recover_iters=value))


def test_settings_round_trip():
    s = GuardSettings.from_dict(dict(spike=dict(factor=5, keys=['loss'])))
    assert isinstance(s.spike, SpikeSettings)
    assert s.to_dict()['spike'] == dict(
        action='skip',
        factor=5,
        window=50,
        warmup=10,
        keys=['loss'],
        grad_norm=True,
        min_value=0.0,
        backoff=True,
    )
    assert GuardSettings().to_dict()['spike'] is None


def test_running_max_rule_by_hand():
    d = detector(factor=10.0)
    # warmup: the first 3 values are admitted unchecked, even a large one
    assert [d.check('loss', 'x', v) for v in (1.0, 50.0, 2.0)] == [None] * 3
    # running max 50: 499 passes, 501 is a spike and is not admitted
    assert d.check('loss', 'x', 499.0) is None
    spike = d.check('loss', 'x', 5010.0)
    assert (spike.value, spike.reference, spike.factor) == (
        5010.0,
        499.0,
        10.0,
    )
    assert list(d.windows['x']) == [1.0, 50.0, 2.0, 499.0]
    # the window holds 4 values: 1.0 and 50.0 leave, the max becomes 499
    d.check('loss', 'x', 3.0)
    d.check('loss', 'x', 4.0)
    assert list(d.windows['x']) == [2.0, 499.0, 3.0, 4.0]
    assert d.check('loss', 'x', 4990.0) is None  # not > 10 x 499
    assert d.check('loss', 'x', 4991.0) is None  # window max is 4990 now


@pytest.mark.parametrize('value', [float('nan'), float('inf'), -float('inf')])
def test_nonfinite_values_are_the_guards_business(value):
    d = detector()
    for v in (1.0, 1.0, 1.0):
        d.check('loss', 'x', v)
    assert d.check('loss', 'x', value) is None
    assert list(d.windows['x']) == [1.0, 1.0, 1.0]


def test_zero_running_max_and_min_value():
    d = detector()
    for v in (0.0, 0.0, 0.0):
        d.check('loss', 'x', v)
    assert d.check('loss', 'x', 1e-6) is None  # no scale to compare with
    d = detector(min_value=0.01)
    for v in (0.0, 0.0, 0.0):
        d.check('loss', 'y', v)
    assert d.check('loss', 'y', 0.11).reference == 0.01  # > 10 x floor
    assert d.check('loss', 'y', 0.1) is None  # not > 10 x 0.01


def record(**terms):
    return IterationRecord(
        loss_terms={k: torch.tensor(v) for k, v in terms.items()}
    )


@pytest.mark.parametrize('action', ['log', 'skip', 'rollback'])
def test_loss_veto_checks_total_and_each_term(action):
    d = detector(action=action)
    for _ in range(3):
        d.begin_iteration()
        assert (
            d.loss_veto(record(loss=2.0, loss_a=1.0, loss_b=1.0, acc=0.5), 2.0)
            is None
        )
    assert set(d.windows) == {'loss', 'loss_a', 'loss_b'}  # not 'acc'
    d.begin_iteration()
    reason = d.loss_veto(
        record(loss=101.0, loss_a=100.0, loss_b=1.0, acc=90.0), 101.0
    )
    assert [(s.name, s.value, s.reference) for s in d.detections] == [
        ('loss', 101.0, 2.0),
        ('loss_a', 100.0, 1.0),
    ]
    if action == 'log':
        assert reason is None
    else:
        assert reason == (
            'spike: loss=101 > 10 x running max 2, '
            'loss_a=100 > 10 x running max 1'
        )
    d.begin_iteration()
    assert d.detections == []


def test_keys_filter_and_several_update_calls_per_iteration():
    d = detector(keys=['loss_b'])
    for _ in range(3):
        d.begin_iteration()
        d.loss_veto(record(loss=2.0, loss_a=1.0), 2.0)
        d.loss_veto(record(loss=3.0, loss_b=3.0), 3.0)
        d.grad_veto(IterationRecord(), 1.0)
        d.grad_veto(IterationRecord(), 2.0)
    # only loss_b, from the 2nd update_params of each iteration; grad
    # norms per step of the iteration
    assert {k: list(v) for k, v in d.windows.items()} == {
        'loss_b#1': [3.0] * 3,
        'grad_norm': [1.0] * 3,
        'grad_norm#1': [2.0] * 3,
    }
    d.begin_iteration()
    assert d.grad_veto(IterationRecord(), 10.0) is None  # not > 10 x 1
    assert d.grad_veto(IterationRecord(), 20.5).startswith(
        'spike: grad_norm#1=20.5 > 10 x running max 2'
    )


def test_state_dict_round_trip():
    d = detector()
    for v in (1.0, 2.0, 3.0, 4.0, 5.0):
        d.check('loss', 'x', v)
    e = detector()
    e.load_state_dict(d.state_dict())
    assert list(e.windows['x']) == [2.0, 3.0, 4.0, 5.0]
    assert e.check('loss', 'x', 50.5).reference == 5.0
    assert math.isclose(e.windows['x'].maxlen, 4)
