# Copyright (c) mmnanguard contributors. All rights reserved.
import math

import pytest
import torch

from mmnanguard.engine.guard import StepGuard
from mmnanguard.engine.guard.finite import (
    any_nonfinite,
    json_number,
    nonfinite_paths,
    total_norm,
)
from mmnanguard.engine.optimizers import GuardedOptimWrapper


def _reference_norm(tensors):
    total = sum(float((t.double() ** 2).sum()) for t in tensors)
    return math.sqrt(total)


def test_total_norm_matches_float64():
    gen = torch.Generator().manual_seed(0)
    tensors = [torch.randn(s, generator=gen) for s in (3, (4, 5), (2, 2, 2))]
    assert float(total_norm(tensors)) == pytest.approx(
        _reference_norm(tensors), rel=1e-6
    )


def test_total_norm_empty_is_zero():
    assert float(total_norm([])) == 0.0
    assert float(total_norm([None])) == 0.0


@pytest.mark.parametrize('bad', [float('nan'), float('inf'), -float('inf')])
def test_total_norm_nonfinite(bad):
    tensors = [torch.ones(3), torch.tensor([1.0, bad])]
    assert not math.isfinite(float(total_norm(tensors)))


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_total_norm_low_precision(dtype):
    tensors = [torch.full((10,), 0.5, dtype=dtype)]
    assert float(total_norm(tensors)) == pytest.approx(
        math.sqrt(2.5), rel=1e-2
    )


def test_nonfinite_paths_names_each_bad_tensor():
    tree = dict(
        state_dict=dict(w=torch.ones(2), b=torch.tensor([float('nan')])),
        optimizer=dict(
            state={
                0: dict(momentum_buffer=torch.tensor([1.0, float('-inf')]))
            },
            param_groups=[dict(lr=0.1)],
        ),
        steps=torch.tensor([3]),
    )  # integer tensors are never non-finite
    assert nonfinite_paths(tree) == [
        'state_dict.b',
        'optimizer.state.0.momentum_buffer',
    ]
    assert nonfinite_paths(dict(a=[torch.zeros(0)])) == []


def _grads():
    params = [torch.nn.Parameter(torch.zeros(2)) for _ in range(3)]
    params[0].grad = torch.tensor([3.0, 4.0])  # 5
    params[1].grad = torch.tensor([1.0, 0.0])  # 1
    params[2].grad = torch.tensor([float('inf'), 0.0])
    return params, {id(p): n for p, n in zip(params, 'xyz')}


def test_top_grad_params_orders_nonfinite_first():
    params, names = _grads()
    guard = StepGuard(names)
    verdict = guard.read(object(), params)
    assert verdict.top_grad_params(names, 2) == [
        dict(name='z', grad_norm='inf'),
        dict(name='x', grad_norm=5.0),
    ]
    assert not verdict.grad_finite and verdict.loss_finite


def test_the_poisoned_parameter_is_named_under_clip_grad():
    """The norms are taken before clip_grad multiplies every gradient by
    max_norm / NaN (which would make every parameter look poisoned)."""
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    wrapper = GuardedOptimWrapper(
        torch.optim.SGD(model.parameters(), lr=0.1),
        clip_grad=dict(max_norm=1.0),
    )
    names = {id(p): n for n, p in model.named_parameters()}
    guard = StepGuard(names)
    wrapper.attach_guard(guard)
    guard.begin_iteration(0)
    before = [p.detach().clone() for p in model.parameters()]
    loss = model(torch.ones(1, 2)).sum()
    wrapper.backward(loss)
    model[1].weight.grad[0, 0] = float('nan')
    wrapper.step()
    (verdict,) = guard.outcome.verdicts
    top = verdict.top_grad_params(names, 4)
    assert top[0] == dict(name='1.weight', grad_norm='nan')
    assert all(isinstance(t['grad_norm'], float) for t in top[1:])
    assert guard.outcome.skipped == 1 and guard.outcome.steps == 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize(
    'value, expected',
    [
        (1.5, 1.5),
        (float('nan'), 'nan'),
        (float('inf'), 'inf'),
        (-float('inf'), '-inf'),
    ],
)
def test_json_number(value, expected):
    assert json_number(value) == expected


@pytest.mark.parametrize(
    'bad, expected',
    [
        (None, False),
        (float('nan'), True),
        (float('inf'), True),
        (-float('inf'), True),
        (3e38, True),  # finite, but the sum leaves the float32 range
    ],
)
def test_any_nonfinite_matches_isfinite(bad, expected):
    tensors = [torch.randn(3, 4), torch.randn(5), torch.zeros(0)]
    if bad is not None:
        tensors[1][2] = bad
        tensors[1][3] = abs(bad)
    assert bool(any_nonfinite(tensors)) is expected
    # float64 reference: the same verdict for the non-finite cases
    if bad is None or not math.isfinite(bad):
        reference = not all(torch.isfinite(t.double()).all() for t in tensors)
        assert bool(any_nonfinite(tensors)) is reference
