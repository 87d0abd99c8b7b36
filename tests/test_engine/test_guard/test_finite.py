# Copyright (c) mmnanguard contributors. All rights reserved.
import math

import pytest
import torch

from mmnanguard.engine.guard.finite import (
    json_number,
    nonfinite_paths,
    top_grad_norms,
    total_norm,
)


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


def test_top_grad_norms_orders_nonfinite_first():
    params = [torch.nn.Parameter(torch.zeros(2)) for _ in range(3)]
    params[0].grad = torch.tensor([3.0, 4.0])  # 5
    params[1].grad = torch.tensor([1.0, 0.0])  # 1
    params[2].grad = torch.tensor([float('inf'), 0.0])
    opt = torch.optim.SGD(params, lr=0.1)
    names = {id(p): n for p, n in zip(params, 'xyz')}
    assert top_grad_norms(names, opt, 2) == [
        dict(name='z', grad_norm='inf'),
        dict(name='x', grad_norm=5.0),
    ]


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
