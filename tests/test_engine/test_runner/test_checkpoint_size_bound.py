# Copyright (c) mmnanguard contributors. All rights reserved.
"""A checkpoint may declare at most 8 times the bytes of the model's
parameters and buffers plus 64 MiB (``checkpoint_fit.FitCheck.
size_problem``), read off the file before any load: real files, real
modules, the bound computed by hand."""

import types

import pytest
import torch
from torch import nn

from mmnanguard.compat.declared_sizes import declared_bytes
from mmnanguard.engine.runner.checkpoint_fit import (
    MODEL_BYTES_FACTOR,
    NOT_FITTING,
    SLACK_BYTES,
    FitCheck,
    state_bytes,
)

MiB = 1 << 20


def _runner(model: nn.Module):
    return types.SimpleNamespace(model=model, optim_wrapper=None)


def test_the_bound_constants():
    assert (MODEL_BYTES_FACTOR, SLACK_BYTES) == (8, 64 * MiB)


def test_state_bytes_counts_each_storage_once():
    model = nn.Sequential(nn.Linear(10, 20), nn.BatchNorm1d(20))
    # weight 200 + bias 20 floats; bn weight, bias, mean, var 4 x 20 floats
    # and num_batches_tracked (int64)
    assert state_bytes(model) == (200 + 20 + 80) * 4 + 8
    tied = nn.Module()
    tied.a = nn.Linear(4, 4, bias=False)
    tied.b = nn.Linear(4, 4, bias=False)
    tied.b.weight = tied.a.weight
    assert state_bytes(tied) == 16 * 4


def test_a_real_checkpoint_of_the_model_passes(tmp_path):
    model = nn.Linear(1000, 1000)  # 4.0 MB
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(2, 1000)).sum().backward()
    optimizer.step()
    path = str(tmp_path / 'iter_1.pth')
    torch.save(
        dict(
            meta=dict(iter=1),
            state_dict=model.state_dict(),
            ema={k: v.clone() for k, v in model.state_dict().items()},
            optimizer=optimizer.state_dict(),
        ),
        path,
    )
    declared = declared_bytes(path)
    assert declared > 4 * state_bytes(model)  # weights, EMA, two moments
    assert FitCheck(_runner(model)).size_problem(path) is None


@pytest.mark.parametrize('legacy', [False, True])
def test_a_file_declaring_more_is_refused_unread(tmp_path, legacy):
    model = nn.Linear(4, 4)  # 80 bytes: the bound is 640 bytes + 64 MiB
    bound = MODEL_BYTES_FACTOR * 80 + SLACK_BYTES
    path = str(tmp_path / 'iter_1.pth')
    big = torch.zeros(bound // 4 + 1)  # one float over, with the pickle
    torch.save(
        dict(state_dict=dict(weight=big)),
        path,
        _use_new_zipfile_serialization=not legacy,
    )
    assert declared_bytes(path) > bound
    problem = FitCheck(_runner(model)).size_problem(path)
    assert problem.startswith(f'{NOT_FITTING}: it declares 64.0 MiB')
    assert 'more than 8 times the 80 bytes' in problem
    assert 'plus 64.0 MiB' in problem
    # just under the bound: passes
    torch.save(
        dict(state_dict=dict(weight=torch.zeros(bound // 4 - 1024))),
        path,
        _use_new_zipfile_serialization=not legacy,
    )
    assert FitCheck(_runner(model)).size_problem(path) is None


@pytest.mark.parametrize('content', [b'', b'not a torch file', b'\0' * 64])
def test_what_is_no_torch_file_is_left_to_the_load(tmp_path, content):
    path = tmp_path / 'iter_1.pth'
    path.write_bytes(content)
    assert declared_bytes(str(path)) is None
    assert FitCheck(_runner(nn.Linear(2, 2))).size_problem(str(path)) is None


def test_a_missing_file_is_left_to_the_load(tmp_path):
    check = FitCheck(_runner(nn.Linear(2, 2)))
    assert check.size_problem(str(tmp_path / 'gone.pth')) is None
