# Copyright (c) mmnanguard contributors. All rights reserved.
"""The checkpoint check on FSDP1's local state dict (mmengine's
``FSDPStrategy`` default, ``state_dict_cfg='local'``): its values are
``ShardedTensor``; each rank checks its local shards, with no collective.

One process over gloo, where FSDP1 does not shard (``NO_SHARD``), so the
``ShardedTensor`` is built from its local shards as FSDP1 builds it; the
2-process run that checks real local state dicts before each write is
``tests/test_distributed/test_fsdp1.py``."""

import math

import pytest
import torch
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor import (
    Shard,
    ShardedTensor,
    init_from_local_shards,
)

from mmnanguard.engine.guard.finite import nonfinite_paths
from mmnanguard.engine.guard.rank_agreement import local_tensors
from mmnanguard.testing.distributed import one_rank_group


def _sharded(values):
    """A 1-D ``ShardedTensor`` of ``values`` split into two local shards."""
    cut = len(values) // 2
    shards = [
        Shard(
            tensor=values[start:stop].clone(),
            metadata=ShardMetadata(
                shard_offsets=[start],
                shard_sizes=[stop - start],
                placement='rank:0/cpu',
            ),
        )
        for start, stop in ((0, cut), (cut, len(values)))
    ]
    return init_from_local_shards(shards, len(values))


@pytest.fixture
def group():
    with one_rank_group():
        yield


def test_local_shards_are_checked_as_plain_tensors(group):
    values = torch.arange(10, dtype=torch.float32)
    state = dict(
        state_dict={'a.weight': _sharded(values), 'steps': torch.ones(2)}
    )
    assert isinstance(state['state_dict']['a.weight'], ShardedTensor)
    plain = local_tensors(state)['state_dict']
    assert type(plain['a.weight']) is torch.Tensor
    assert torch.equal(plain['a.weight'], values)
    assert nonfinite_paths(state) == []


@pytest.mark.parametrize('bad', [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize('index', [0, 9])
def test_nonfinite_local_shard_is_named(group, bad, index):
    values = torch.arange(10, dtype=torch.float32)
    values[index] = bad
    state = dict(
        state_dict={'a.weight': _sharded(values), 'b.weight': torch.ones(3)}
    )
    assert nonfinite_paths(state) == ['state_dict.a.weight']
    assert nonfinite_paths(local_tensors(state)) == ['state_dict.a.weight']
