# Copyright (c) mmnanguard contributors. All rights reserved.
"""The generators' record in a checkpoint: a real state survives
``torch.save``/``torch.load(weights_only=True)`` and restores the same
draws; every crafted record is refused with its problem, never taken."""

import random

import numpy as np
import pytest
import torch

from mmnanguard.engine.guard.rng import capture_rng_state, restore_rng_state
from mmnanguard.engine.resume.rng_record import (
    rng_record,
    rng_state_from_record,
)


def _draws():
    return (
        random.random(),
        float(np.random.rand()),
        float(torch.rand(())),
        float(np.random.randn()),  # uses numpy's cached gaussian
    )


def test_record_round_trip_through_a_file_restores_the_draws(tmp_path):
    random.seed(3)
    np.random.seed(4)
    torch.manual_seed(5)
    np.random.randn()  # leave a cached gaussian in numpy's state
    record = rng_record(capture_rng_state())
    expected = _draws()
    path = tmp_path / 'record.pth'
    torch.save(record, path)
    loaded = torch.load(path, weights_only=True)  # plain data only
    state, problems = rng_state_from_record(loaded)
    assert problems == []
    _draws()  # move every generator on
    restore_rng_state(state)
    assert _draws() == expected


def _good():
    return rng_record(capture_rng_state())


def _replace(path, value):
    record = _good()
    part, index = path
    record[part][index] = value
    return record


CRAFTED = {
    'not a dict': ([1, 2], 'expected a dict'),
    'python keys too few': (
        _replace(('python', 1), torch.zeros(10, dtype=torch.int64)),
        'python',
    ),
    'python key >= 2**32': (
        _replace(('python', 1), torch.full((625,), 2**32)),
        'python',
    ),
    'python position out of range': (
        _replace(
            ('python', 1),
            torch.cat(
                [torch.zeros(624, dtype=torch.int64), torch.tensor([625])]
            ),
        ),
        'position 625',
    ),
    'python gauss NaN': (_replace(('python', 2), float('nan')), 'gauss'),
    'numpy keys float': (
        _replace(('numpy', 1), torch.zeros(624)),
        'numpy',
    ),
    'numpy negative key': (
        _replace(('numpy', 1), torch.full((624,), -1)),
        'numpy',
    ),
    'numpy position 10**9': (_replace(('numpy', 2), 10**9), 'numpy'),
    'numpy has_gauss True': (_replace(('numpy', 3), True), 'numpy'),
    'numpy gaussian inf': (_replace(('numpy', 4), float('inf')), 'numpy'),
    'numpy other generator': (_replace(('numpy', 0), 'PCG64'), 'MT19937'),
}


@pytest.mark.parametrize('name', list(CRAFTED))
def test_crafted_record_is_refused(name):
    record, problem = CRAFTED[name]
    before = capture_rng_state()
    state, problems = rng_state_from_record(record)
    assert state is None
    assert any(problem in p for p in problems), problems
    after = capture_rng_state()  # nothing was restored
    assert torch.equal(before['torch'], after['torch'])
    assert before['python'] == after['python']


@pytest.mark.parametrize(
    'value', [torch.zeros(10, dtype=torch.uint8), torch.zeros(5056), 'x']
)
def test_torch_state_of_another_shape_or_type_is_refused(value):
    record = _good()
    record['torch'] = value
    state, problems = rng_state_from_record(record)
    assert state is None and problems == [
        'torch: expected the uint8 state of a CPU generator'
    ]


@pytest.mark.skipif(torch.cuda.is_available(), reason='a CPU-only process')
def test_cuda_part_without_a_gpu_is_left_out_and_said():
    record = _good()
    record['cuda'] = [torch.zeros(16, dtype=torch.uint8)]
    state, problems = rng_state_from_record(record)
    assert state is not None and 'cuda' not in state
    assert problems == ['cuda: saved by a run on a GPU; none is in use here']
