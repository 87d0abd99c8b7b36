# Copyright (c) mmnanguard contributors. All rights reserved.
"""``close_process_group``: a barrier only after a completed run, the
group destroyed either way, nothing done without a group.

The two-rank case (a rank that finishes while rank 0 still writes the
last checkpoint) runs in ``tests/test_distributed``: every worker there
ends through this function.
"""

import pytest
import torch.distributed as torch_dist

from mmnanguard.engine.runner.process_group_close import close_process_group


@pytest.mark.parametrize('completed, barriers', [(True, 1), (False, 0)])
def test_barrier_only_after_a_completed_run(monkeypatch, completed, barriers):
    seen = []
    real_barrier = torch_dist.barrier
    monkeypatch.setattr(
        torch_dist, 'barrier', lambda *a, **k: seen.append(real_barrier())
    )
    torch_dist.init_process_group(
        'gloo', store=torch_dist.HashStore(), rank=0, world_size=1
    )
    try:
        close_process_group(completed)
        assert len(seen) == barriers
        assert not torch_dist.is_initialized()
    finally:
        if torch_dist.is_initialized():
            torch_dist.destroy_process_group()


def test_no_group_is_a_no_op(monkeypatch):
    assert not torch_dist.is_initialized()
    monkeypatch.setattr(
        torch_dist, 'barrier', lambda *a, **k: pytest.fail('barrier called')
    )
    close_process_group(True)
    assert not torch_dist.is_initialized()
