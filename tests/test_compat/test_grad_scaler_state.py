# Copyright (c) mmnanguard contributors. All rights reserved.
"""The GradScaler adapter reads torch's private scaler state exactly, and
fails by name on a torch whose fields changed."""

import math

import pytest
import torch

from mmnanguard.compat.grad_scaler_state import (
    FIELDS,
    amp_state,
    forget_unscale,
)


def _unscaled(grad_value: float, init_scale: float = 1024.0):
    """A CPU GradScaler that unscaled one parameter's gradient."""
    param = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([param], lr=0.1)
    scaler = torch.amp.GradScaler('cpu', init_scale=init_scale)
    scaler.scale(torch.ones(()))  # creates the scale, as a backward would
    param.grad = torch.full((3,), grad_value)
    scaler.unscale_(optimizer)
    return scaler, optimizer, param


def test_the_private_fields_exist_on_this_torch():
    scaler, _, _ = _unscaled(1.0)
    missing = [f for f in FIELDS if not hasattr(scaler, f)]
    assert not missing, (
        f'torch {torch.__version__} changed GradScaler: no {missing}; '
        'update mmnanguard/compat/grad_scaler_state.py'
    )


@pytest.mark.parametrize(
    'grad,found', [(2.0, 0.0), (math.nan, 1.0), (math.inf, 1.0)]
)
def test_found_inf_scale_and_tracker_match_the_public_values(grad, found):
    scaler, optimizer, param = _unscaled(grad * 1024.0)
    found_inf, scale, tracker = amp_state(scaler, optimizer)
    assert found_inf.item() == found
    assert scale.item() == scaler.get_scale() == 1024.0
    assert tracker.item() == 0
    if found == 0.0:  # unscale_ divided by the scale
        assert torch.equal(param.grad, torch.full((3,), grad))
    # the values the scaler's own step decides from
    scaler.step(optimizer)
    scaler.update()
    assert scaler.get_scale() == (512.0 if found else 1024.0)


def test_no_scaler_or_a_disabled_one_gives_none():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1)
    assert amp_state(None, optimizer) is None
    disabled = torch.amp.GradScaler('cpu', enabled=False)
    assert amp_state(disabled, optimizer) is None


def test_a_missing_field_is_named():
    scaler, optimizer, _ = _unscaled(1.0)
    del scaler._growth_tracker
    with pytest.raises(RuntimeError, match=r"\['_growth_tracker'\]"):
        amp_state(scaler, optimizer)


def test_forget_unscale_lets_the_next_step_unscale_again():
    """After a dropped step, the next ``unscale_`` of the same optimizer is
    allowed (torch refuses a second ``unscale_`` while the record stands)
    and the scale is the one before."""
    scaler, optimizer, param = _unscaled(2.0 * 1024.0)
    with pytest.raises(RuntimeError, match='unscale_'):
        scaler.unscale_(optimizer)  # the record of the first one stands
    forget_unscale(scaler, optimizer)
    param.grad = torch.full((3,), 4.0 * 1024.0)
    scaler.unscale_(optimizer)
    assert torch.equal(param.grad, torch.full((3,), 4.0))
    assert scaler.get_scale() == 1024.0


def test_forget_unscale_names_a_missing_field():
    scaler, optimizer, _ = _unscaled(1.0)
    del scaler._per_optimizer_states
    with pytest.raises(RuntimeError, match='_per_optimizer_states'):
        forget_unscale(scaler, optimizer)
