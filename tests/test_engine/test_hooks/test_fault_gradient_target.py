# Copyright (c) mmnanguard contributors. All rights reserved.
"""Which parameter ``FaultInjectionHook``'s ``nan_grad`` poisons.

The first trainable parameter an optimizer holds; under DeepSpeed ZeRO,
whose optimizer holds flat partitions and none of the module's
parameters, the first trainable one; a parameter with no element on this
rank (an empty shard) is never picked, and a module with nothing to
poison gets an error that names the way out.
"""

import pytest
import torch
from torch import nn

from mmnanguard.testing.fault_injection_hook import _gradient_target


class Three(nn.Module):
    """``a`` frozen, ``empty`` trainable with no element, ``b`` and ``c``
    trainable."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.ones(2), requires_grad=False)
        self.empty = nn.Parameter(torch.ones(0))
        self.b = nn.Parameter(torch.ones(3))
        self.c = nn.Parameter(torch.ones(4))


def test_first_trainable_held_by_an_optimizer():
    model = Three()
    assert _gradient_target(model, {id(model.c)}) is model.c
    held = {id(p) for p in model.parameters()}
    assert _gradient_target(model, held) is model.b


def test_optimizer_holding_none_of_the_module_takes_the_first_trainable():
    # ZeRO: the optimizer steps flat fp32 partitions, not these
    model = Three()
    assert _gradient_target(model, {id(torch.ones(1))}) is model.b


@pytest.mark.parametrize('held', ['a', 'empty'])
def test_nothing_to_poison_is_named(held):
    model = Three()
    with pytest.raises(RuntimeError, match='fault=nan_grad on rank 0') as err:
        _gradient_target(model, {id(getattr(model, held))})
    assert '2 such parameter(s)' in str(err.value)
    assert 'fault=inf_loss' in str(err.value)
