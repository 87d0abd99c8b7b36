# Copyright (c) mmnanguard contributors. All rights reserved.
"""SpikeDetector and SpikeSettings against hand calculations."""

import numpy as np
import pytest
import torch
from mmengine.runner import Runner

from mmnanguard.engine.guard import GuardSettings, SpikeDetector, SpikeSettings
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
        action='log',
        factor=5,
        window=50,
        warmup=10,
        keys=['loss'],
        grad_norm=True,
        min_value=0.0,
        backoff=True,
    )
    assert GuardSettings().to_dict()['spike'] is None


def check(d, name, value, grad=None):
    """One step's check of one quantity; the spike (host values) or None."""
    result = d.check({name: torch.tensor(value)}, grad)
    flags = result.flags.tolist()
    spikes = result.spikes(
        flags,
        result.values.tolist(),
        result.references.tolist(),
        d.settings.factor,
    )
    return next((s for s in spikes if s.name == name), None)


def test_running_max_rule_by_hand():
    d = detector(factor=10.0)
    # warmup: the first 3 values are admitted unchecked, even a large one
    assert [check(d, 'x', v) for v in (1.0, 50.0, 2.0)] == [None] * 3
    # running max 50: exactly 10 x 50 passes (the rule is '>')
    assert check(d, 'x', 500.0) is None  # not > 10 x 50
    spike = check(d, 'x', 5000.5)  # > 10 x 500
    assert (spike.value, spike.reference, spike.factor) == (
        5000.5,
        500.0,
        10.0,
    )
    assert d.windows()['x'] == [1.0, 50.0, 2.0, 500.0]
    # the window holds 4 values: 1.0 and 50.0 leave, the max stays 500
    check(d, 'x', 3.0)
    check(d, 'x', 4.0)
    assert d.windows()['x'] == [2.0, 500.0, 3.0, 4.0]
    assert check(d, 'x', 5000.0) is None  # not > 10 x 500
    assert check(d, 'x', 5001.0) is None  # window max is 5000 now


def test_the_factor_boundary_on_a_window_of_one_value():
    d = detector(factor=10.0, warmup=1, window=1)
    check(d, 'x', 50.0)
    assert check(d, 'x', 500.0) is None  # exactly 10 x: not a spike
    assert d.windows()['x'] == [500.0]
    assert check(d, 'x', 5001.0).reference == 500.0


@pytest.mark.parametrize(
    'factor, reference', [(10.0, 50.0), (10.0, 0.37), (3.0, 0.1), (2.5, 7e3)]
)
def test_the_factor_boundary_exactly(factor, reference):
    # the rule: a spike is a value above factor x the window's max, in the
    # float32 the detector computes in; the threshold, the float32 just
    # below it and the one just above it
    ref = np.float32(reference)
    threshold = np.float32(factor) * ref
    below = np.nextafter(threshold, np.float32(0))
    above = np.nextafter(threshold, np.float32(np.inf))
    verdicts = {}
    for name, value in (('below', below), ('at', threshold), ('above', above)):
        d = detector(factor=factor, warmup=1, window=1)
        assert check(d, 'x', float(ref)) is None
        spike = check(d, 'x', float(value))
        verdicts[name] = spike is not None
        if spike is not None:
            assert spike.reference == float(ref)
            assert spike.value == float(value)
    assert verdicts == dict(below=False, at=False, above=True)


@pytest.mark.parametrize('value', [float('nan'), float('inf'), -float('inf')])
def test_nonfinite_values_are_the_guards_business(value):
    d = detector()
    for v in (1.0, 1.0, 1.0):
        check(d, 'x', v)
    assert check(d, 'x', value) is None
    assert d.windows()['x'] == [1.0, 1.0, 1.0]


def test_zero_running_max_and_min_value():
    d = detector()
    for v in (0.0, 0.0, 0.0):
        check(d, 'x', v)
    assert check(d, 'x', 1e-6) is None  # no scale to compare with
    d = detector(min_value=0.01)
    for v in (0.0, 0.0, 0.0):
        check(d, 'y', v)
    assert check(d, 'y', 0.11).reference == pytest.approx(0.01)
    assert check(d, 'y', 0.099) is None  # not > 10 x 0.01


def terms(**values):
    return {k: torch.tensor(v) for k, v in values.items()}


@pytest.mark.parametrize('action', ['log', 'skip', 'rollback'])
def test_total_and_each_loss_term_are_checked(action):
    d = detector(action=action)
    for _ in range(3):
        values = d.loss_values(
            torch.tensor(2.0),
            terms(loss=2.0, loss_a=1.0, loss_b=1.0, acc=0.5),
            '',
        )
        d.check(values)
    assert set(d.windows()) == {'loss', 'loss_a', 'loss_b'}  # not 'acc'
    values = d.loss_values(
        torch.tensor(101.0),
        terms(loss=101.0, loss_a=100.0, loss_b=1.0, acc=90.0),
        '',
    )
    result = d.check(values)
    spikes = result.spikes(
        result.flags.tolist(),
        result.values.tolist(),
        result.references.tolist(),
        10.0,
    )
    assert [(s.name, s.value, s.reference) for s in spikes] == [
        ('loss', 101.0, 2.0),
        ('loss_a', 100.0, 1.0),
    ]
    assert d.acts is (action != 'log')


def test_keys_filter_steps_of_an_iteration_and_the_grad_norm():
    d = detector(keys=['loss_b'])
    for _ in range(3):
        d.check(
            d.loss_values(None, terms(loss=2.0, loss_a=1.0), ''),
            torch.tensor(1.0),
        )
        d.check(
            d.loss_values(None, terms(loss=3.0, loss_b=3.0), '#1'),
            torch.tensor(2.0),
            '#1',
        )
    # only loss_b, from the 2nd step of each iteration; grad norms per
    # step of the iteration
    assert d.windows() == {
        'grad_norm': [1.0] * 3,
        'loss_b#1': [3.0] * 3,
        'grad_norm#1': [2.0] * 3,
    }
    assert check(d, 'unused', 1.0, torch.tensor(10.0)) is None
    result = d.check({}, torch.tensor(20.5), '#1')
    flags = dict(zip(result.names, result.flags.tolist()))
    assert flags['grad_norm#1'] and not flags['grad_norm']


def test_a_loss_spike_keeps_the_grad_norm_out_of_its_window():
    d = detector()
    for _ in range(3):
        d.check({'loss': torch.tensor(1.0)}, torch.tensor(1.0))
    d.check({'loss': torch.tensor(100.0)}, torch.tensor(2.0))
    assert d.windows() == {'loss': [1.0] * 3, 'grad_norm': [1.0] * 3}


def test_state_dict_round_trip():
    d = detector()
    for v in (1.0, 2.0, 3.0, 4.0, 5.0):
        check(d, 'x', v)
    e = detector()
    e.load_state_dict(d.state_dict())
    assert e.windows()['x'] == [2.0, 3.0, 4.0, 5.0]
    assert check(e, 'x', 50.5).reference == 5.0
    assert e.windows()['x'] == [2.0, 3.0, 4.0, 5.0]
