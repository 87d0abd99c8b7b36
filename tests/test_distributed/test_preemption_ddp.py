# Copyright (c) mmnanguard contributors. All rights reserved.
"""Preemption under DDP, FSDP1 and DeepSpeed: ``NanGuardRunner`` + DDP and
``NanGuardFlexibleRunner`` with ``DDPStrategy``, ``FSDPStrategy`` (full
state dicts) and ``DeepSpeedStrategy`` (ZeRO-2, the development stack), 2
CPU processes over gloo started by torchrun (``ways_in_worker.py``, the
include way, ``slow``).

Each iteration of the worker ends by writing a marker and sleeping 0.5 s.
On rank 1's marker of iteration 4 the test sends SIGTERM to every rank, or
to rank 1 only. The signal lands during iteration 4's sleep, so the step of
iteration 5 carries the flag in the guard's ``all_reduce`` and every rank
stops after iteration 5: one checkpoint ``iter_5.pth`` (the periodic
checkpoints are off; DeepSpeed's is a folder of every rank's partition),
named by ``last_checkpoint``, complete and finite;
every rank records ``TrainingPreempted`` at that iteration and exits 4
(``EXIT_PREEMPTED``). torchrun itself exits 1 (a failed worker group,
whatever the status): its summary names the first rank to exit, status 4,
as the root cause; the other rank's status reads 4, or -15 when torchrun's
teardown SIGTERM reaches it while it shuts down (after the checkpoint and
its own record: harmless).
``--resume`` then continues from iteration 5 to 8 with the same finite
weights on both ranks.
"""

import glob
import importlib.util
import json
import os
import os.path as osp
import re
import signal
import subprocess
import sys
import time

import pytest
import torch
from integration_utils import REPO, run_script

from mmnanguard.engine.runner.preemption import EXIT_PREEMPTED
from mmnanguard.testing.distributed import free_port, torchrun_args
from mmnanguard.testing.tiny_configs import tensors_all_finite

needs_deepspeed = pytest.mark.skipif(
    importlib.util.find_spec('deepspeed') is None,
    reason='deepspeed is installed in the development stack only',
)
#: DeepSpeed writes a checkpoint as a folder: the model states are here.
DEEPSPEED_MODEL_STATES = 'mp_rank_00_model_states.pt'

HERE = osp.dirname(osp.abspath(__file__))
WORKER = osp.join(HERE, 'ways_in_worker.py')
SIGNAL_AT = 4  # the marker (iteration) that triggers the signal
STOP_AT = SIGNAL_AT + 1  # the boundary where every rank stops
MAX_ITERS = 8

pytestmark = pytest.mark.slow


def _torchrun(mode, work, *extra):
    return torchrun_args(2, free_port()) + [
        WORKER,
        'include',
        mode,
        str(work),
        str(MAX_ITERS),
        *extra,
    ]


def _preempted_run(mode, work, targets, *extra):
    """Start the slow run, SIGTERM ``targets`` (ranks) at the marker;
    return torchrun's status and its output."""
    env = dict(os.environ, PYTHONWARNINGS='ignore', OMP_NUM_THREADS='1')
    proc = subprocess.Popen(
        [sys.executable] + _torchrun(mode, work, 'slow', *extra),
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        marker = work / f'reached_rank1_iter{SIGNAL_AT}'
        deadline = time.monotonic() + 240
        while not marker.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                out = proc.communicate(timeout=60)[0]
                pytest.fail(f'no marker {marker.name}:\n{out[-6000:]}')
            time.sleep(0.02)
        for rank in targets:
            path = work / f'reached_rank{rank}_iter{SIGNAL_AT}'
            while not path.exists() or not path.read_text():
                time.sleep(0.02)
            os.kill(int(path.read_text()), signal.SIGTERM)
        out = proc.communicate(timeout=240)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out


def _checkpoint(path: str, mode: str) -> dict:
    """The checkpoint ``path``: ``meta``, ``state_dict`` and the optimizer
    state (DeepSpeed: read from the folder, every rank's partition)."""
    if mode != 'deepspeed':
        return torch.load(path, map_location='cpu', weights_only=False)
    states = torch.load(
        osp.join(path, DEEPSPEED_MODEL_STATES),
        map_location='cpu',
        weights_only=False,
    )
    partitions = sorted(glob.glob(osp.join(path, '*optim_states.pt')))
    assert len(partitions) == 2, partitions
    return dict(
        meta=states['meta'],
        state_dict=states['module'],
        optimizer=[
            torch.load(p, map_location='cpu', weights_only=False)[
                'optimizer_state_dict'
            ]
            for p in partitions
        ],
    )


@pytest.mark.parametrize(
    'mode',
    [
        'runner',
        'flexible',
        'fsdp1',
        pytest.param('deepspeed', marks=needs_deepspeed),
    ],
)
@pytest.mark.parametrize('targets', [(0, 1), (1,)], ids=['all', 'rank1'])
def test_sigterm_saves_once_exits_4_and_resumes(mode, targets, tmp_path):
    work = tmp_path / 'work'
    work.mkdir()
    status, out = _preempted_run(mode, work, targets)

    # torchrun exits 1 (a failed worker group); the first rank to exit is
    # the root cause with status 4; torchrun then sends SIGTERM to the
    # ranks still shutting down, so their status reads 4 or -15
    assert status == 1, out[-6000:]
    root = out.split('Root Cause')[1]
    assert f'exitcode  : {EXIT_PREEMPTED} ' in root, out[-6000:]
    statuses = re.findall(r'exitcode  : (-?\d+)', out)
    assert set(statuses) <= {str(EXIT_PREEMPTED), '-15'}, out[-6000:]
    for rank in (0, 1):
        info = json.load(open(work / f'preempted_rank{rank}.json'))
        assert info['iteration'] == STOP_AT
        assert info['checkpoint'] == str(work / f'iter_{STOP_AT}.pth')
        # the signal's name on the ranks that got it
        expected = 'SIGTERM' if rank in targets else 'a signal on another'
        assert info['signal'].startswith(expected)
        # no rank ran past the boundary
        assert (work / f'reached_rank{rank}_iter{STOP_AT}').exists()
        assert not (work / f'reached_rank{rank}_iter{STOP_AT + 1}').exists()
    assert sorted(osp.basename(p) for p in glob.glob(str(work / '*.pth'))) == [
        f'iter_{STOP_AT}.pth'
    ]
    assert not glob.glob(str(work / '*.tmp*')) + glob.glob(str(work / '.*'))
    named = (work / 'last_checkpoint').read_text().strip()
    assert named == str(work / f'iter_{STOP_AT}.pth')
    ckpt = _checkpoint(named, mode)
    assert ckpt['meta']['iter'] == STOP_AT
    assert tensors_all_finite(ckpt['state_dict'])
    assert tensors_all_finite(ckpt['optimizer'])

    out = run_script(
        _torchrun(mode, work, 'resume'),
        timeout=300,
        env=dict(OMP_NUM_THREADS='1'),
    )
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-6000:]
    assert f'resumed epoch: 0, iter: {STOP_AT}' in log, log[-6000:]
    final = _checkpoint(str(work / f'iter_{MAX_ITERS}.pth'), mode)
    assert final['meta']['iter'] == MAX_ITERS
    weights = [
        torch.load(str(work / f'weights_rank{r}.pth'), map_location='cpu')
        for r in (0, 1)
    ]
    assert tensors_all_finite(weights[0])
    assert weights[1].keys() == weights[0].keys()
    assert all(torch.equal(weights[1][k], weights[0][k]) for k in weights[0])
    state = {
        k.removeprefix('module.'): v for k, v in final['state_dict'].items()
    }
    assert all(torch.equal(state[k], weights[0][k]) for k in weights[0])
    # the resumed run trained on from the preemption checkpoint
    saved = {
        k.removeprefix('module.'): v for k, v in ckpt['state_dict'].items()
    }
    assert not all(torch.equal(saved[k], weights[0][k]) for k in saved)


@pytest.mark.parametrize('workers', [(), ('workers',)], ids=['0', '2'])
@pytest.mark.parametrize('loop', [(), ('epoch',)], ids=['iter', 'epoch'])
def test_ddp_resume_ends_with_the_uninterrupted_weights(
    loop, workers, tmp_path
):
    """SIGTERM to both ranks of a DDP run (``NanGuardRunner``; the NaN
    gradient of rank 1 skipped at iteration 3; each sample's inputs
    jittered by numpy's generator, as a random transform draws, and
    dropped out by torch's in the model), resumed at iteration 5: each
    rank's shard of the sampler continues where it stopped, the jitter and
    the dropout draw again what they drew, and the weights at iteration 8
    equal, every tensor, those of the same run never interrupted (bare
    mmengine's resume, which reloads the trained batches, replays the
    jitter but not the dropout). With 2 loader workers per rank the
    batches' seeds reach the workers, and the dropout draws from each
    rank's main-process generator (``diff_rank_seed=True``: they differ by
    rank), which the checkpoint holds per rank.
    The epoch-based loop (epochs of 4 iterations) resumes in the middle of
    epoch 2."""
    whole = tmp_path / 'whole'
    whole.mkdir()
    out = run_script(
        _torchrun('runner', whole, 'jitter', *workers, *loop),
        timeout=300,
        env=dict(OMP_NUM_THREADS='1'),
    )
    assert out.returncode == 0, (out.stdout + out.stderr)[-6000:]
    work = tmp_path / 'work'
    work.mkdir()
    status, log = _preempted_run(
        'runner', work, (0, 1), 'jitter', *workers, *loop
    )
    assert status == 1, log[-6000:]
    out = run_script(
        _torchrun('runner', work, 'resume', 'jitter', *workers, *loop),
        timeout=300,
        env=dict(OMP_NUM_THREADS='1'),
    )
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-6000:]
    assert f'nanguard: resumed at iteration {STOP_AT}' in log, log[-6000:]
    for rank in (0, 1):
        expected = torch.load(str(whole / f'weights_rank{rank}.pth'))
        resumed = torch.load(str(work / f'weights_rank{rank}.pth'))
        assert expected.keys() == resumed.keys()
        differ = [
            k for k in expected if not torch.equal(expected[k], resumed[k])
        ]
        assert differ == [], (rank, differ)
    assert 'random generators restored, each rank its own' in log
