# Copyright (c) mmnanguard contributors. All rights reserved.
"""The guard's own state read back from a checkpoint (its ``nanguard``
key) is checked value by value: a wrong one is refused by its key, and
nothing of the state is taken."""

import math

import numpy as np
import pytest

from mmnanguard.engine.guard import (
    GuardResponder,
    GuardSettings,
    GuardStateError,
)


def _responder():
    return GuardResponder(GuardSettings(spike=dict()))


def _state():
    return dict(
        counters=dict(skipped=2, rollbacks=1),
        lr_backoff=dict(multiplier=0.25, ramp_from=0.5, ramp_start=4),
        spike=dict(windows={'loss': [1.0, 2.0], 'grad_norm': [3.0]}),
    )


def test_a_state_the_guard_wrote_round_trips():
    first = _responder()
    first.load_state_dict(_state())
    second = _responder()
    second.load_state_dict(first.state_dict())
    assert second.lr_backoff.multiplier == 0.25
    assert second.lr_backoff.state_dict() == dict(
        multiplier=0.25, ramp_from=0.5, ramp_start=4
    )
    assert second.counters['skipped'] == 2
    assert second.counters['rollbacks'] == 1
    assert second.spike_detector.windows() == {
        'loss': [1.0, 2.0],
        'grad_norm': [3.0],
    }


@pytest.mark.parametrize(
    'path, value, expected',
    [
        ('lr_backoff.multiplier', math.nan, 'a finite number in (0, 1]'),
        ('lr_backoff.multiplier', math.inf, 'a finite number in (0, 1]'),
        ('lr_backoff.multiplier', 0.0, 'a finite number in (0, 1]'),
        ('lr_backoff.multiplier', 2.0, 'a finite number in (0, 1]'),
        ('lr_backoff.multiplier', '0.5', 'a finite number in (0, 1]'),
        ('lr_backoff.multiplier', True, 'a finite number in (0, 1]'),
        ('lr_backoff.ramp_from', -0.5, 'a finite number in (0, 1]'),
        ('lr_backoff.ramp_start', -1, 'an int >= 0'),
        ('lr_backoff.ramp_start', 2.5, 'an int >= 0'),
        ('counters.skipped', -3, 'an int >= 0'),
        ('counters.rollbacks', '1', 'an int >= 0'),
        ('counters.rollbacks', np.float64(1.0), 'an int >= 0'),
        ('spike.windows', [1.0], 'a dict'),
    ],
)
def test_a_value_of_the_wrong_form_is_refused_by_its_key(
    path, value, expected
):
    state = _state()
    section, name = path.split('.')
    state[section][name] = value
    responder = _responder()
    before = responder.state_dict()
    with pytest.raises(GuardStateError) as err:
        responder.load_state_dict(state)
    assert err.value.key == f'nanguard.{path}'
    message = str(err.value)
    assert message.startswith(f'nanguard.{path} is {value!r} (')
    assert message.endswith(f'expected {expected}')
    assert responder.state_dict() == before  # nothing taken


def test_a_non_finite_spike_window_value_is_named_by_index():
    state = _state()
    state['spike']['windows']['loss'] = [1.0, math.nan]
    with pytest.raises(GuardStateError) as err:
        _responder().load_state_dict(state)
    assert err.value.key == 'nanguard.spike.windows.loss[1]'


def test_a_state_that_is_not_a_dict_is_refused():
    with pytest.raises(GuardStateError) as err:
        _responder().load_state_dict([('counters', {})])
    assert err.value.key == 'nanguard.<state>'
