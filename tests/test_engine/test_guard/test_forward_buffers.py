# Copyright (c) mmnanguard contributors. All rights reserved.
"""Buffers written by the forward (BatchNorm statistics): checked in the
step's one read, restored to their values before the forward when they
came out non-finite, and the step dropped; a healthy step keeps what the
forward wrote."""

import math

import pytest
import torch
from torch import nn

from mmnanguard.engine.guard import StepGuard
from mmnanguard.engine.guard.forward_buffers import ForwardBuffers
from mmnanguard.engine.guard.verdict_kind import incident_kind
from mmnanguard.engine.incident import IncidentKind
from mmnanguard.engine.optimizers import GuardedOptimWrapper

#: A pixel whose square passes float32: BatchNorm's variance overflows.
NODATA = -3.4e38


def _model():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 1, 1)
    )


def _guarded(model):
    wrapper = GuardedOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    guard = StepGuard(
        {id(p): n for n, p in model.named_parameters()},
        buffers=dict(model.named_buffers()),
    )
    wrapper.attach_guard(guard)
    return wrapper, guard


def _state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _iteration(model, wrapper, guard, iteration, images):
    guard.begin_iteration(iteration)
    loss = model(images).mean()
    wrapper.update_params(loss)
    return guard.outcome


def _images(value=None):
    images = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    if value is not None:
        images[1, :, :3, :3] = value
    return images


@pytest.mark.parametrize(
    'value', [NODATA, -float(torch.finfo(torch.float32).max), 2e19]
)
def test_an_overflowing_forward_is_restored_and_skipped(value):
    model = _model()
    wrapper, guard = _guarded(model)
    _iteration(model, wrapper, guard, 0, _images())
    before = _state(model)
    outcome = _iteration(model, wrapper, guard, 1, _images(value))
    (verdict,) = outcome.verdicts
    # independent of the guard: the same forward on a copy overflows
    copy = _model()
    copy.load_state_dict(before)
    copy(_images(value))
    assert not torch.isfinite(copy[1].running_var).all()
    assert verdict.buffers_finite is False
    assert verdict.restored_buffers == ['1.running_var']
    assert incident_kind(verdict) is IncidentKind.NONFINITE_BUFFERS
    assert outcome.skipped == 1 and outcome.steps == 0
    after = _state(model)
    assert after.keys() == before.keys()
    for key in before:  # weights and every buffer, the counter too
        assert torch.equal(after[key], before[key]), key


def test_a_healthy_forward_keeps_its_statistics():
    model = _model()
    wrapper, guard = _guarded(model)
    before = _state(model)
    images = _images()
    outcome = _iteration(model, wrapper, guard, 0, images)
    (verdict,) = outcome.verdicts
    assert verdict.buffers_finite is True and not verdict.restored_buffers
    assert outcome.steps == 1
    # running_mean = 0.9 * 0 + 0.1 * batch mean of the conv output, in
    # float64 from the weights before the step
    conv = nn.Conv2d(3, 4, 3).double()
    conv.load_state_dict(
        {k[2:]: v.double() for k, v in before.items() if k.startswith('0.')}
    )
    expected = 0.1 * conv(images.double()).mean(dim=(0, 2, 3))
    assert torch.allclose(
        model[1].running_mean.double(), expected, rtol=1e-5, atol=1e-7
    )
    assert int(model[1].num_batches_tracked) == 1


@pytest.mark.parametrize('bad', [math.nan, math.inf, -math.inf])
def test_a_non_finite_input_keeps_its_kind_and_restores_too(bad):
    # a NaN pixel makes the loss and BatchNorm's statistics non-finite;
    # the loss names the incident, the buffers are put back all the same
    model = _model()
    wrapper, guard = _guarded(model)
    before = _state(model)
    (verdict,) = _iteration(model, wrapper, guard, 0, _images(bad)).verdicts
    verdict.inputs_finite = False  # what the data preprocessor's flag says
    assert incident_kind(verdict) is IncidentKind.NONFINITE_LOSS
    assert verdict.restored_buffers == ['1.running_mean', '1.running_var']
    for key, value in _state(model).items():
        assert torch.equal(value, before[key]), key


def test_the_copy_is_taken_before_the_first_micro_batch_of_a_window():
    model = _model()
    wrapper = GuardedOptimWrapper(
        torch.optim.SGD(model.parameters(), lr=0.1), accumulative_counts=2
    )
    guard = StepGuard({}, buffers=dict(model.named_buffers()))
    wrapper.attach_guard(guard)
    before = _state(model)
    # the bad micro-batch is the first of the window, the read the second's
    outcome = _iteration(model, wrapper, guard, 0, _images(NODATA))
    assert outcome.verdicts == []
    outcome = _iteration(model, wrapper, guard, 1, _images())
    (verdict,) = outcome.verdicts
    assert verdict.buffers_finite is False and outcome.skipped == 1
    for key, value in _state(model).items():
        assert torch.equal(value, before[key]), key


def test_restore_without_a_copy_changes_nothing():
    buffers = ForwardBuffers({'a': torch.tensor([math.inf])})
    assert buffers.restore() == []
    assert buffers.buffers[0].item() == math.inf
    assert ForwardBuffers({}).flag() is None


def test_non_contiguous_and_scalar_buffers_round_trip():
    wide = torch.arange(12.0).reshape(3, 4).t()  # non-contiguous
    scalar = torch.tensor(2.0)
    counter = torch.tensor(5)
    buffers = ForwardBuffers(dict(wide=wide, scalar=scalar, counter=counter))
    expected = [wide.clone(), scalar.clone(), counter.clone()]
    buffers.save()
    wide.fill_(math.nan)
    scalar.fill_(math.inf)
    counter.fill_(9)
    assert buffers.nonfinite() == ['wide', 'scalar']
    assert bool(buffers.flag())
    assert buffers.restore() == ['wide', 'scalar']
    for got, want in zip((wide, scalar, counter), expected):
        assert torch.equal(got, want)
    assert not bool(buffers.flag())
