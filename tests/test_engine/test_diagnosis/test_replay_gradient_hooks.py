# Copyright (c) mmnanguard contributors. All rights reserved.
"""The replay of an incident does not run the hooks an engine put on the
parameters' gradient accumulation (DeepSpeed ZeRO-1/2 reduce and partition
gradients there, ``register_post_accumulate_grad_hook``): under ZeRO-2 the
replay's backward ran them a second time for one step, and the next step
failed with DeepSpeed's "The parameter b.bias has already been reduced"
(``tests/test_distributed/test_ways_in.py``'s DeepSpeed cells). The hooks
are back, and run, once the replay is over."""

import types

import torch

from mmnanguard.engine.diagnosis.replay_state import replay_model
from mmnanguard.testing.toy import ToyModel


def _runner(model):
    return types.SimpleNamespace(model=model)


def _loss(model) -> torch.Tensor:
    losses = model(torch.ones(2, 4), torch.zeros(2, 1), mode='loss')
    return sum(losses.values())


def test_replay_mutes_the_hooks_and_puts_them_back():
    model = ToyModel()
    calls = []
    handles = [
        param.register_post_accumulate_grad_hook(
            lambda p, name=name: calls.append(name)
        )
        for name, param in model.named_parameters()
    ]
    report = dict(kind='nonfinite_loss', iteration=3)
    with replay_model(_runner(model), report) as (replayed, _):
        assert replayed is model
        _loss(replayed).backward()
        assert calls == []
        assert all(p.grad is not None for p in replayed.parameters())
    # the live gradients (none here) are restored, and the hooks run again
    assert all(p.grad is None for p in model.parameters())
    _loss(model).backward()
    assert sorted(calls) == sorted(n for n, _ in model.named_parameters())
    # their handles still remove them
    for handle in handles:
        handle.remove()
    calls.clear()
    _loss(model).backward()
    assert calls == []


def test_the_hooks_are_put_back_when_the_replay_fails():
    model = ToyModel()
    calls = []
    model.a.weight.register_post_accumulate_grad_hook(
        lambda p: calls.append('a.weight')
    )
    report = dict(kind='nonfinite_loss', iteration=3)
    try:
        with replay_model(_runner(model), report):
            raise RuntimeError('the replay failed')
    except RuntimeError:
        pass
    _loss(model).backward()
    assert calls == ['a.weight']


def test_a_model_without_such_hooks_is_replayed_as_before():
    model = ToyModel()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = dict(kind='nonfinite_loss', iteration=3)
    with replay_model(_runner(model), report) as (replayed, state):
        _loss(replayed).backward()
        with torch.no_grad():
            replayed.a.weight.add_(1.0)
        assert 'live weights' in state
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
