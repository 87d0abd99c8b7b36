# Copyright (c) mmnanguard contributors. All rights reserved.
"""``DeepSpeedOptimWrapper`` gets the registered guarded class, whether the
protected runner builds it (the config type is renamed) or the hook alone
swaps the class of a built one; a wrapper whose engine built no ZeRO-1/2
optimizer is refused when the guard attaches, with the fix. (The guarded
steps themselves run under DeepSpeed in
``tests/test_distributed/test_deepspeed.py``.)"""

import pytest
import torch
from mmengine._strategy.deepspeed import DeepSpeedOptimWrapper
from mmengine.registry import OPTIM_WRAPPERS

from mmnanguard.engine.guard.step_guard import StepGuard
from mmnanguard.engine.optimizers import (
    GuardedDeepSpeedOptimWrapper,
    install_step_guard,
)
from mmnanguard.engine.runner.guarded_optim_config import (
    guarded_optim_wrapper_cfg,
)


def test_the_config_names_the_guarded_wrapper():
    cfg, kept = guarded_optim_wrapper_cfg(
        dict(type='DeepSpeedOptimWrapper', optimizer=dict(type='SGD', lr=1))
    )
    assert cfg['type'] == 'mmnanguard.GuardedDeepSpeedOptimWrapper'
    assert kept == []
    assert OPTIM_WRAPPERS.get(cfg['type']) is GuardedDeepSpeedOptimWrapper


def test_the_hook_alone_swaps_in_the_guarded_class_and_refuses_non_zero():
    model = torch.nn.Linear(2, 1)
    wrapper = DeepSpeedOptimWrapper(torch.optim.SGD(model.parameters(), 0.1))
    guard = StepGuard({id(p): n for n, p in model.named_parameters()})
    with pytest.raises(TypeError) as err:
        install_step_guard(wrapper, guard)
    assert type(wrapper) is GuardedDeepSpeedOptimWrapper
    assert isinstance(wrapper, DeepSpeedOptimWrapper)
    assert 'zero_optimization=dict(stage=1)' in str(err.value)
    assert 'SGD' in str(err.value)
    assert wrapper.nanguard is None  # not attached
