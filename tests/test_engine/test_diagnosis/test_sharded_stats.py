# Copyright (c) mmnanguard contributors. All rights reserved.
"""The diagnosis's weight statistics and the resume's size bound on
sharded parameters (DTensors), in a one-process gloo group.

Under FSDP2 a small parameter (a ``[1, 4]`` weight sharded by rows over 2
ranks) leaves one rank an empty shard: ``max()`` on it raised "Expected
reduction dim ... numel() == 0" in the diagnosis, and the resume's size
bound asked a DTensor for its storage. Each rank now reads its own part
(no collective), and the bound counts a DTensor by its global size.
"""

import math

import pytest
import torch
import torch.distributed as torch_dist
from torch import nn

from mmnanguard.engine.diagnosis.diagnose import module_weight_stats
from mmnanguard.engine.diagnosis.magnitude import max_abs, own_weight_max
from mmnanguard.engine.runner.checkpoint_fit import state_bytes

dtensor = pytest.importorskip('torch.distributed.tensor')


@pytest.fixture
def mesh():
    torch_dist.init_process_group(
        'gloo', store=torch_dist.HashStore(), rank=0, world_size=1
    )
    try:
        from torch.distributed.device_mesh import init_device_mesh

        yield init_device_mesh('cpu', (1,))
    finally:
        torch_dist.destroy_process_group()


def _sharded(local: torch.Tensor, shape, mesh) -> nn.Parameter:
    """A DTensor parameter of global ``shape`` whose part here is
    ``local`` (rows of a ``Shard(0)`` placement)."""
    value = dtensor.DTensor.from_local(
        local,
        mesh,
        [dtensor.Shard(0)],
        run_check=False,
        shape=torch.Size(shape),
        stride=torch.empty(shape).stride(),
    )
    return nn.Parameter(value)


class TwoLinear(nn.Module):
    """Two parameters, sharded: ``a`` holds this rank's rows, ``b`` none
    (the other rank's, as FSDP2 leaves it on rank 1)."""

    def __init__(self, mesh) -> None:
        super().__init__()
        self.a = nn.Module()
        self.a.weight = _sharded(
            torch.tensor([[0.5, -3.0, 2.0, 1.0]]), (1, 4), mesh
        )
        self.b = nn.Module()
        self.b.weight = _sharded(torch.empty(0, 4), (1, 4), mesh)


@pytest.mark.parametrize(
    'special, expected',
    [
        (None, 3.0),
        (math.inf, math.inf),
        (-math.inf, math.inf),
        (math.nan, 3.0),
    ],
)
def test_max_abs_reads_this_ranks_part(mesh, special, expected):
    model = TwoLinear(mesh)
    if special is not None:
        with torch.no_grad():
            model.a.weight.to_local()[0, 0] = special
    assert max_abs(list(model.parameters())) == expected
    assert own_weight_max(model.a) == expected


def test_empty_shard_has_no_max(mesh):
    model = TwoLinear(mesh)
    assert own_weight_max(model.b) is None
    assert module_weight_stats(model, 'b') == dict(module='b', max_abs='nan')
    assert module_weight_stats(model, '') == dict(module='', max_abs='3')


def test_size_bound_counts_a_dtensor_by_its_global_size(mesh):
    # 2 parameters of 1 x 4 float32 each, whatever this rank holds
    assert state_bytes(TwoLinear(mesh)) == 2 * 4 * 4
