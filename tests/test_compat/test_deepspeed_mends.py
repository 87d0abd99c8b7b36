# Copyright (c) mmnanguard contributors. All rights reserved.
"""The DeepSpeed mends and the ZeRO adapter, on the stack that has
deepspeed (the development stack); elsewhere each mend does nothing."""

import importlib
import importlib.util
import inspect

import pytest

import mmnanguard  # noqa: F401  (applies the mends)
from mmnanguard.compat import (
    APPLIED,
    deepspeed_checkpoint_hooks,
    deepspeed_cpu_comm,
    deepspeed_optimizers,
    deepspeed_zero,
)

pytestmark = pytest.mark.stack_smoke

HAS_DEEPSPEED = importlib.util.find_spec('deepspeed') is not None
needs_deepspeed = pytest.mark.skipif(
    not HAS_DEEPSPEED,
    reason='deepspeed is installed in the development stack only',
)


@pytest.mark.skipif(HAS_DEEPSPEED, reason='this stack has deepspeed')
def test_without_deepspeed_nothing_is_mended():
    for name in (
        'deepspeed_optimizers',
        'deepspeed_checkpoint_hooks',
        'deepspeed_checkpoint_load',
        'deepspeed_cpu_comm',
    ):
        assert APPLIED[name] is False, name


@needs_deepspeed
def test_the_strategy_builds_with_the_optimizers_deepspeed_has():
    from mmengine._strategy import deepspeed as strategy_module
    from mmengine.registry import OPTIMIZERS

    missing = []
    for module, name in deepspeed_optimizers.DEEPSPEED_OPTIMIZERS:
        try:
            getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            missing.append(name)
    # mmengine's own registration imports every one of them
    assert APPLIED['deepspeed_optimizers'] is bool(missing)
    if not missing:
        pytest.skip('this deepspeed has every optimizer mmengine imports')
    assert 'OnebitAdam' in missing  # removed in deepspeed 0.19.8
    assert (
        strategy_module.register_deepspeed_optimizers
        is deepspeed_optimizers.register_deepspeed_optimizers
    )
    strategy = strategy_module.DeepSpeedStrategy(
        zero_optimization=dict(stage=2)
    )
    assert strategy.config['zero_optimization'] == dict(stage=2)
    names = deepspeed_optimizers.register_deepspeed_optimizers()
    assert 'FusedAdam' in names and not set(names) & set(missing)
    for name in names:
        assert name in OPTIMIZERS.module_dict


@needs_deepspeed
def test_the_strategy_calls_the_checkpoint_hooks():
    from mmengine._strategy.deepspeed import DeepSpeedStrategy

    assert APPLIED['deepspeed_checkpoint_hooks']
    for method in (
        DeepSpeedStrategy.save_checkpoint,
        DeepSpeedStrategy.resume,
    ):
        assert method._nanguard
        # mmengine 0.10.7's own method, wrapped, still ignores it
        assert 'callback(' not in inspect.getsource(method.__wrapped__)
    assert not deepspeed_checkpoint_hooks.is_needed()  # applied once


@needs_deepspeed
def test_the_cpu_backend_starts_without_the_compiled_op():
    from deepspeed.accelerator import get_accelerator

    torch_comm = importlib.import_module('deepspeed.comm.torch')

    on_cpu = get_accelerator()._name == 'cpu'
    assert APPLIED['deepspeed_cpu_comm'] is on_cpu
    if on_cpu:
        assert torch_comm.build_shm_op is deepspeed_cpu_comm.build_shm_op
        assert torch_comm.build_shm_op() is None


@needs_deepspeed
def test_the_zero_members_the_adapter_reads_exist():
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    source = inspect.getsource(DeepSpeedZeroOptimizer)
    for name in deepspeed_zero.ZERO_MEMBERS:
        assert (
            f'self.{name} =' in source or f'def {name}(' in source
        ), f'DeepSpeedZeroOptimizer.{name} is gone: update deepspeed_zero.py'
    # the overflow branch the forced skip takes
    step = inspect.getsource(DeepSpeedZeroOptimizer.step)
    assert 'if self.check_grad_overflow:' in step
    assert 'self.check_overflow(' in step
