# Copyright (c) mmnanguard contributors. All rights reserved.
"""Every documented way in, under one process, ``Runner`` + DDP,
``FlexibleRunner`` + ``DDPStrategy``, ``FSDPStrategy`` (FSDP1, full state
dicts) and ``DeepSpeedStrategy`` (ZeRO-2; the development stack) (2 CPU
processes over gloo).

The ways in (``ways_in_worker.py``): the include as the upstream scripts
build it, the settings-only twin with no runner line, ``NanGuardHook``
alone in ``custom_hooks``, and ``tools/train.py --guard skip``'s config
edit. Each cell trains a toy model for 6 iterations with checkpoints every
2 (written on rank 0 only, as mmengine does; DeepSpeed: a folder every
rank writes its partition into), a NaN gradient (FSDP1 and DeepSpeed: an
inf loss) planted at iteration 3 on the last rank, then resumes to
iteration 8.

The DeepSpeed cells of the include, the twin and ``--guard`` failed at
the step after the incident (DeepSpeed's "The parameter b.bias has already
been reduced"): the diagnosis's replay ran ZeRO's gradient hooks a second
time; they are muted during the replay now.

Every cell must end with exit 0, one skipped incident at iteration 3 seen
by every rank, the same finite weights on every rank, finite checkpoints
at iterations 2, 4 and 6, and a resume that continues to iteration 8.
Before the check before a checkpoint moved into ``save_checkpoint`` on
every rank, the hook alone aborted every DDP cell at its first checkpoint
(gloo: "Received data size doesn't match expected size": the check's
collective ran on rank 0 alone).
"""

import glob
import importlib.util
import json
import os
import os.path as osp

import pytest
import torch
from integration_utils import run_script

from mmnanguard.testing.distributed import free_port, torchrun_args
from mmnanguard.testing.tiny_configs import tensors_all_finite

HERE = osp.dirname(osp.abspath(__file__))
WORKER = osp.join(HERE, 'ways_in_worker.py')
WAYS = ('include', 'twin', 'hook', 'guard')
FLEXIBLE = ('flexible', 'fsdp1', 'deepspeed')
needs_deepspeed = pytest.mark.skipif(
    importlib.util.find_spec('deepspeed') is None,
    reason='deepspeed is installed in the development stack only '
    '(tools/setup/stacks/rotate.txt)',
)
# one process: the ways whose single-process build changed (the include
# and --guard train in one process throughout the suite)
CELLS = (
    [(way, 'runner', 1) for way in ('twin', 'hook')]
    + [
        (way, mode, 2)
        for mode in ('runner', 'flexible', 'fsdp1')
        for way in WAYS
    ]
    + [
        pytest.param(way, 'deepspeed', 2, marks=needs_deepspeed)
        for way in WAYS
    ]
)
PROTECTED = dict(
    runner='NanGuardRunner', **{m: 'NanGuardFlexibleRunner' for m in FLEXIBLE}
)
PLAIN = dict(runner='Runner', **{m: 'FlexibleRunner' for m in FLEXIBLE})
#: The incident the planted fault makes (``ways_in_worker.FAULTS``).
KIND = dict(fsdp1='nonfinite_loss', deepspeed='nonfinite_loss')
#: DeepSpeed writes a checkpoint as a folder: the model states are here.
DEEPSPEED_MODEL_STATES = 'mp_rank_00_model_states.pt'


def _checkpoint(work, step: int, mode: str) -> dict:
    """``iter_<step>.pth`` (DeepSpeed: its model states, the weights under
    ``state_dict`` as in the other modes)."""
    path = work / f'iter_{step}.pth'
    if mode == 'deepspeed':
        assert sorted(os.listdir(path))[0] == DEEPSPEED_MODEL_STATES
        ckpt = torch.load(
            str(path / DEEPSPEED_MODEL_STATES),
            map_location='cpu',
            weights_only=False,
        )
        ckpt['state_dict'] = ckpt.pop('module')
        return ckpt
    return torch.load(str(path), map_location='cpu', weights_only=False)


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
        kind = KIND.get(mode, 'nonfinite_grad')
        assert (report['kind'], report['iteration']) == (kind, 3)
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
        ckpt = _checkpoint(work, step, mode)
        assert ckpt['meta']['iter'] == step
        assert tensors_all_finite(ckpt['state_dict'])
    # written under a temporary name and renamed: none is left
    assert not [n for n in os.listdir(work) if 'nanguard-tmp' in n]
    final = _checkpoint(work, 6, mode)
    state = {
        k.removeprefix('module.'): v for k, v in final['state_dict'].items()
    }
    assert all(torch.equal(state[k], weights[0][k]) for k in weights[0])

    log = _run(way, mode, nproc, work, 8, 'resume')
    assert 'resumed epoch: 0, iter: 6' in log, log[-6000:]
    assert 'training starts from scratch' not in log
    resumed = _checkpoint(work, 8, mode)
    assert resumed['meta']['iter'] == 8
    assert tensors_all_finite(resumed['state_dict'])
    after = [
        torch.load(str(work / f'weights_rank{r}.pth'), map_location='cpu')
        for r in range(nproc)
    ]
    assert not all(torch.equal(after[0][k], weights[0][k]) for k in after[0])
    for other in after[1:]:
        assert all(torch.equal(other[k], after[0][k]) for k in other)
