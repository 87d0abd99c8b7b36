# Copyright (c) mmnanguard contributors. All rights reserved.
"""Every documented way in, under one process, ``Runner`` + DDP and
``FlexibleRunner`` + ``DDPStrategy`` (2 CPU processes over gloo).

The ways in (``ways_in_worker.py``): the include as the upstream scripts
build it, the settings-only twin with no runner line, ``NanGuardHook``
alone in ``custom_hooks``, and ``tools/train.py --guard skip``'s config
edit. Each cell trains a toy model for 6 iterations with checkpoints every
2 (written on rank 0 only, as mmengine does), a NaN gradient planted at
iteration 3 on the last rank, then resumes to iteration 8.

Every cell must end with exit 0, one skipped incident at iteration 3 seen
by every rank, the same finite weights on every rank, finite checkpoints
at iterations 2, 4 and 6, and a resume that continues to iteration 8.
Before the check before a checkpoint moved into ``save_checkpoint`` on
every rank, the hook alone aborted every DDP cell at its first checkpoint
(gloo: "Received data size doesn't match expected size": the check's
collective ran on rank 0 alone).
"""

import glob
import json
import os.path as osp

import pytest
import torch
from integration_utils import run_script

from mmnanguard.testing.distributed import free_port, torchrun_args
from mmnanguard.testing.tiny_configs import tensors_all_finite

HERE = osp.dirname(osp.abspath(__file__))
WORKER = osp.join(HERE, 'ways_in_worker.py')
WAYS = ('include', 'twin', 'hook', 'guard')
# one process: the ways whose single-process build changed (the include
# and --guard train in one process throughout the suite)
CELLS = [(way, 'runner', 1) for way in ('twin', 'hook')] + [
    (way, mode, 2) for mode in ('runner', 'flexible') for way in WAYS
]
PROTECTED = {'runner': 'NanGuardRunner', 'flexible': 'NanGuardFlexibleRunner'}
PLAIN = {'runner': 'Runner', 'flexible': 'FlexibleRunner'}

pytestmark = pytest.mark.slow


def _run(way, mode, nproc, work, max_iters, *extra):
    out = run_script(
        torchrun_args(nproc, free_port())
        + [WORKER, way, mode, str(work), str(max_iters), *extra],
        timeout=300,
        env=dict(OMP_NUM_THREADS='1'),
    )
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-6000:]
    return log


@pytest.mark.parametrize('way,mode,nproc', CELLS)
def test_way_in_checkpoints_fault_and_resume(way, mode, nproc, tmp_path):
    work = tmp_path / 'work'
    work.mkdir()
    _run(way, mode, nproc, work, 6)
    expected = (PLAIN if way == 'hook' else PROTECTED)[mode]
    for rank in range(nproc):
        built = (work / f'runner_rank{rank}.txt').read_text()
        assert built == expected

    reports = [
        json.load(open(p))
        for p in glob.glob(str(work / 'nanguard' / '*' / 'report.json'))
    ]
    assert sorted(r['rank'] for r in reports) == list(range(nproc))
    for report in reports:
        assert (report['kind'], report['iteration']) == ('nonfinite_grad', 3)
        assert report['action'] == 'skip'

    weights = [
        torch.load(str(work / f'weights_rank{r}.pth'), map_location='cpu')
        for r in range(nproc)
    ]
    assert tensors_all_finite(weights[0])
    for other in weights[1:]:
        assert other.keys() == weights[0].keys()
        assert all(torch.equal(other[k], weights[0][k]) for k in other)

    for step in (2, 4, 6):
        ckpt = torch.load(
            str(work / f'iter_{step}.pth'),
            map_location='cpu',
            weights_only=False,
        )
        assert ckpt['meta']['iter'] == step
        assert tensors_all_finite(ckpt['state_dict'])
    final = torch.load(
        str(work / 'iter_6.pth'), map_location='cpu', weights_only=False
    )
    state = {
        k.removeprefix('module.'): v for k, v in final['state_dict'].items()
    }
    assert all(torch.equal(state[k], weights[0][k]) for k in weights[0])

    log = _run(way, mode, nproc, work, 8, 'resume')
    assert 'resumed' in log.lower() or 'resume' in log.lower()
    resumed = torch.load(
        str(work / 'iter_8.pth'), map_location='cpu', weights_only=False
    )
    assert resumed['meta']['iter'] == 8
    assert tensors_all_finite(resumed['state_dict'])
    after = [
        torch.load(str(work / f'weights_rank{r}.pth'), map_location='cpu')
        for r in range(nproc)
    ]
    assert not all(torch.equal(after[0][k], weights[0][k]) for k in after[0])
    for other in after[1:]:
        assert all(torch.equal(other[k], after[0][k]) for k in other)
