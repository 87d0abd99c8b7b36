# Copyright (c) mmnanguard contributors. All rights reserved.
"""The ``FSDPStrategy`` mends (:mod:`mmnanguard.compat.fsdp1_cpu`): on a
CPU-only torch, mmengine's strategy wraps a model, saves its full state
dict and loads its optimizer state back, in one process over gloo (the
2-process runs are in ``tests/test_distributed/test_fsdp1.py``)."""

import copy
import inspect

import pytest
import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

from mmnanguard.compat import APPLIED, fsdp1_cpu
from mmnanguard.testing.distributed import one_rank_group
from mmnanguard.testing.toy import ToyDataset, ToyModel

pytestmark = pytest.mark.stack_smoke

FSDPStrategy = fsdp1_cpu.FSDPStrategy
needs_strategy = pytest.mark.skipif(
    FSDPStrategy is None, reason='no FSDPStrategy on this stack'
)


@pytest.fixture
def one_rank(monkeypatch):
    """A gloo group of one rank, and torchrun's ``LOCAL_RANK``."""
    monkeypatch.setenv('LOCAL_RANK', '0')
    with one_rank_group():
        yield


def _strategy(tmp_path, **kwargs):
    return FSDPStrategy(work_dir=str(tmp_path), **kwargs)


@needs_strategy
def test_mends_follow_the_stack():
    assert APPLIED['fsdp1_cpu'] is True
    assert FSDPStrategy._wrap_model.nanguard_mended
    assert FSDPStrategy._init_state_dict_cfg.nanguard_mended
    # torch >= 2.1 takes (model, optim, optim_state_dict)
    wrong = fsdp1_cpu.optim_load_order_wrong()
    params = inspect.signature(FSDP.optim_state_dict_to_load).parameters
    assert wrong is (list(params)[0] == 'model')
    mended = FSDPStrategy.load_optim_state_dict is (
        fsdp1_cpu.load_optim_state_dict
    )
    assert mended is wrong


@needs_strategy
@pytest.mark.skipif(torch.cuda.is_available(), reason='CPU-only mends')
def test_full_state_dict_cfg_is_not_offloaded_on_cpu(tmp_path):
    strategy = _strategy(tmp_path, state_dict_cfg='full')
    assert strategy.state_dict_config.offload_to_cpu is False
    assert strategy.state_dict_config.rank0_only is True
    # a config that asks for it explicitly gets the same on the CPU
    strategy = _strategy(
        tmp_path,
        state_dict_cfg=dict(
            state_dict_type='FULL_STATE_DICT',
            state_dict_config=dict(
                type='FullStateDictConfig', offload_to_cpu=True
            ),
        ),
    )
    assert strategy.state_dict_config.offload_to_cpu is False


def _train_step(model, optim_wrapper, batch):
    losses = model(batch['inputs'], batch['labels'], mode='loss')
    optim_wrapper.update_params(sum(losses.values()))


@needs_strategy
@pytest.mark.skipif(torch.cuda.is_available(), reason='CPU-only mends')
def test_wrap_save_and_load_on_cpu(tmp_path, one_rank):
    torch.manual_seed(0)
    strategy = _strategy(tmp_path, state_dict_cfg='full')
    reference = ToyModel()
    model = ToyModel()
    model.load_state_dict(reference.state_dict())
    model = strategy._wrap_model(model)  # device_id='cpu' by the mend
    assert isinstance(model, FSDP)
    assert strategy.model_wrapper['device_id'] == 'cpu'
    strategy.model = model
    strategy.optim_wrapper = strategy.build_optim_wrapper(
        dict(
            type='OptimWrapper',
            optimizer=dict(type='SGD', lr=0.1, momentum=0.9),
        ),
        model,
    )
    data = ToyDataset(n=4)
    batch = dict(inputs=data.inputs[:2], labels=data.labels[:2])
    for _ in range(2):
        _train_step(model, strategy.optim_wrapper, batch)
    # the same two steps on the unwrapped model, by hand
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for _ in range(2):
        optimizer.zero_grad()
        losses = reference(batch['inputs'], batch['labels'], mode='loss')
        sum(losses.values()).backward()
        optimizer.step()
    # the full state dict (the path that crashed with offload_to_cpu)
    full = strategy.model_state_dict()
    assert full.keys() == reference.state_dict().keys()
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(full[name], value)
    # the optimizer state goes back in (mmengine's argument order failed)
    saved = copy.deepcopy(strategy.optim_state_dict())
    momenta = {
        id(p): s['momentum_buffer'].clone()
        for p, s in strategy.optim_wrapper.optimizer.state.items()
    }
    for state in strategy.optim_wrapper.optimizer.state.values():
        state['momentum_buffer'].zero_()
    strategy.load_optim_state_dict(saved)
    loaded = strategy.optim_wrapper.optimizer.state
    assert loaded
    for param, state in loaded.items():
        assert torch.equal(state['momentum_buffer'], momenta[id(param)])
    # the stock call order fails on this torch
    if fsdp1_cpu.optim_load_order_wrong():
        with pytest.raises(TypeError):
            FSDP.optim_state_dict_to_load(
                saved, model, strategy.optim_wrapper.optimizer
            )
