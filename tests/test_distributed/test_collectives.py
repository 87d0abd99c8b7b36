# Copyright (c) mmnanguard contributors. All rights reserved.
"""The guard's collectives per iteration under FSDP2, pinned (2 gloo
processes, mmdet's RetinaNet sharded by ``fully_shard``), with and without
``clip_grad``.

At the call sites (a ``TorchDispatchMode``) the guard adds one collective,
the ``all_reduce`` of its verdict, in both cases, and both ranks make the
same collectives. The process group's sequence number also sees what
DTensors issue inside their dispatch: the reduction of the sharded
gradients' norm. The guard folds that norm into its ``all_reduce``
(``mmnanguard/engine/guard/grad_norm.py``), so with ``clip_grad`` it adds
nothing (its ``all_reduce`` replaces ``clip_grad_norm_``'s reduction, which
bare training makes too) and without it adds exactly one. (DDP is pinned in
``tests/test_benchmarks/test_host_syncs.py``.) The instrument and the runs
are those of ``benchmarks/distributed_guard.py``."""

import os.path as osp
import sys

import pytest

BENCHMARKS = osp.join(
    osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))), 'benchmarks'
)
sys.path.insert(0, BENCHMARKS)

import distributed_guard as bench  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.mark.parametrize('clip, group_added', [('clip', 0), ('noclip', 1)])
def test_fsdp2_guard_collectives(tiny_coco_root, tmp_path, clip, group_added):
    off = bench.run_one(tiny_coco_root, 'fsdp2', 'off', clip, str(tmp_path))
    on = bench.run_one(tiny_coco_root, 'fsdp2', 'skip', clip, str(tmp_path))
    assert off['ranks_agree'] and on['ranks_agree']
    added = {
        site: on['collective_sites'].get(site, 0) - count
        for site, count in off['collective_sites'].items()
    }
    added.update(
        {
            site: count
            for site, count in on['collective_sites'].items()
            if site not in off['collective_sites']
        }
    )
    added = {site: n for site, n in added.items() if n}
    assert on['collectives'] - off['collectives'] == 1, added
    assert len(added) == 1 and 'step_guard.py' in next(iter(added)), added
    # the process group's own count (DTensor-internal collectives too), in
    # every iteration counted
    each = [
        a - b
        for a, b in zip(
            on['group_collectives_each'], off['group_collectives_each']
        )
    ]
    assert each and set(each) == {group_added}, each
