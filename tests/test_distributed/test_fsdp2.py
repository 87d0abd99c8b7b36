# Copyright (c) mmnanguard contributors. All rights reserved.
"""The include with torch's FSDP2 (``fully_shard``) over gloo, 2 CPU
processes: parameters, gradients and optimizer states are DTensors sharded
over the ranks; faults planted on rank 1 only.

Iteration 1: a NaN gradient in rank 1's shard -> the global norm (a
replicated DTensor) is NaN on both ranks -> skipped on both.
Iteration 3 (the last): a NaN in rank 1's shard of the momentum -> rank 1's
parameter shard turns NaN in the step; the parameter check (each rank its
shards, summed in one vote) is read before ``epoch_2.pth`` is written, on
every rank -> a rollback on both ranks. ``epoch_1.pth`` holds rank 0's
shards only (mmengine's ``Runner`` saves a sharded model's DTensors as
they are): it is refused on both ranks and each rank restores its own
in-memory snapshot shards.

The restored weights are compared with the full weights the ranks had at
the iteration the log names, saved independently by the test worker.
"""

import glob
import json
import os.path as osp
import re

import pytest
import torch
from integration_utils import run_script

from mmnanguard.testing.distributed import free_port, torchrun_args

HERE = osp.dirname(osp.abspath(__file__))
REPO = osp.dirname(osp.dirname(HERE))
TINY_RETINANET = osp.join(
    REPO, 'configs', 'tiny', 'retinanet_r18_fpn_tiny-coco.py'
)

pytestmark = pytest.mark.slow


def _load(path):
    return torch.load(path, map_location='cpu', weights_only=False)


def test_fsdp2_fault_on_one_rank_agreed_skip_and_rollback(
    tiny_coco_root, tmp_path
):
    config = tmp_path / 'fsdp2.py'
    config.write_text(
        f'_base_ = [{TINY_RETINANET!r}, "mmnanguard::_base_/nanguard.py"]\n'
        "custom_imports = dict(imports=['mmnanguard.testing'],"
        ' allow_failed_imports=False)\n'
        'custom_hooks = [\n'
        "    dict(type='FaultInjectionHook', fault='nan_grad', iteration=1,"
        ' rank=1),\n'
        "    dict(type='FaultInjectionHook', fault='nan_optimizer_state',"
        ' iteration=3, rank=1),\n'
        ']\n'
        "nanguard = dict(snapshot_interval=2, rollback_source='checkpoint',"
        ' hooks=[])\n'
        'train_cfg = dict(max_epochs=2)\n'
        'optim_wrapper = dict(optimizer=dict(lr=0.01, momentum=0.9))\n'
        'train_dataloader = dict(dataset=dict('
        f'data_root={tiny_coco_root + "/"!r}))\n'
    )
    work = tmp_path / 'work'
    work.mkdir()
    out = run_script(
        torchrun_args(2, free_port())
        + [osp.join(HERE, 'dist_worker.py'), str(config), str(work), 'fsdp2'],
        timeout=420,
        env=dict(OMP_NUM_THREADS='1'),
    )
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-6000:]
    by_rank = {0: [], 1: []}
    for path in sorted(
        glob.glob(str(work / 'nanguard' / '*' / 'report.json'))
    ):
        report = json.load(open(path))
        by_rank[report['rank']].append(
            (report['iteration'], report['kind'], report['action'])
        )
    assert by_rank[0] == by_rank[1], by_rank
    assert by_rank[0] == [
        (1, 'nonfinite_grad', 'skip'),
        (3, 'nonfinite_params', 'rollback'),
    ]
    # the sharded checkpoint was refused (rank 0's log; the reports above
    # show the same action on both ranks) for the in-memory snapshot
    assert 'holds the DTensor shards of one rank' in log, log[-4000:]
    restored = set(
        re.findall(
            r'rolled back to the state of iteration (\d+) \(from memory\)',
            log,
        )
    )
    assert len(restored) == 1, restored
    restored = list(restored)
    # the full weights at that iteration, saved by the worker: the start
    # (iteration 0) or the end of epoch 1 (iteration 2)
    source = {'0': 'start', '2': 'epoch0'}[restored[0]]
    for rank in (0, 1):
        reference = _load(str(work / f'{source}_rank{rank}.pth'))
        final = _load(str(work / f'weights_rank{rank}.pth'))
        assert reference.keys() == final.keys()
        for name, expected in reference.items():
            assert torch.equal(final[name], expected), (rank, name)
            if expected.is_floating_point():
                assert torch.isfinite(final[name]).all(), name
    # the parameters (gathered) are the same on both ranks; BatchNorm
    # running statistics are per rank (FSDP2 does not broadcast buffers)
    w0 = _load(str(work / 'weights_rank0.pth'))
    w1 = _load(str(work / 'weights_rank1.pth'))
    for name in w0:
        if 'running_' not in name and 'num_batches' not in name:
            assert torch.equal(w0[name], w1[name]), name
