# Copyright (c) mmnanguard contributors. All rights reserved.
"""The sampling profiler of ``benchmarks/overhead.py --sample`` gives each
function the wall time it was on the stack, against the clock."""

import os.path as osp
import sys
import time

import torch

BENCHMARKS = osp.join(
    osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))),
    'benchmarks',
)
sys.path.insert(0, BENCHMARKS)

from stack_sampler import StackSampler, frame_key  # noqa: E402


def _key(function) -> str:
    return frame_key(function.__code__)


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _kernels(seconds: float) -> None:
    a = torch.randn(256, 256)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a = torch.tanh(a @ a)  # torch releases the GIL in its kernels


def _work() -> None:
    _spin(0.5)
    time.sleep(0.2)
    _kernels(0.5)


def test_times_each_function_on_the_stack_against_the_clock():
    sampler = StackSampler(interval=0.002)
    start = time.perf_counter()
    sampler.start()
    _work()
    sampler.stop()
    elapsed = time.perf_counter() - start
    assert sampler.samples > 100
    assert abs(sampler.sampled_s - elapsed) < 0.1
    inclusive = sampler.inclusive
    # each part of the work, within 0.1 s of its wall time (a busy machine
    # delays looks, never loses time: every look charges what elapsed)
    for function, seconds in ((_spin, 0.5), (_kernels, 0.5)):
        assert abs(inclusive[_key(function)] - seconds) < 0.1, function
    assert abs(inclusive[_key(_work)] - 1.2) < 0.1
    # the sleep is self time of _work (a C call below it)
    assert abs(sampler.self_time[_key(_work)] - 0.2) < 0.1
    data = sampler.as_dict()
    assert data['samples'] == sampler.samples
    assert data['inclusive'][_key(_work)] == inclusive[_key(_work)]


def test_recursion_counts_once_and_keys_are_relative():
    def fall(n: int) -> None:
        if n:
            fall(n - 1)
        else:
            _spin(0.2)

    sampler = StackSampler()
    sampler.start()
    fall(20)
    sampler.stop()
    key = _key(fall)
    assert key.endswith('test_stack_sampler.py:fall')
    assert abs(sampler.inclusive[key] - 0.2) < 0.05
    assert abs(sampler.inclusive[key] - sampler.sampled_s) < 0.05
    module = torch.nn.Module._call_impl.__code__  # below site-packages
    assert frame_key(module) == 'torch/nn/modules/module.py:_call_impl'
