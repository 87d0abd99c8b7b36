# Copyright (c) mmnanguard contributors. All rights reserved.
"""Every documented way in, under one process, ``Runner`` + DDP,
``FlexibleRunner`` + ``DDPStrategy``, ``FSDPStrategy`` (FSDP1, full state
dicts) and ``DeepSpeedStrategy`` (ZeRO-2; the development stack), and
``Runner`` with torch's FSDP2 (2 CPU processes over gloo).

The ways in (``ways_in_worker.py``): the include as the upstream scripts
build it, the settings-only twin with no runner line, ``NanGuardHook``
alone in ``custom_hooks``, and ``tools/train.py --guard skip``'s config
edit. Each cell trains a toy model for 6 iterations with checkpoints every
2 (written on rank 0 only, as mmengine does; DeepSpeed: a folder every
rank writes its partition into), a NaN gradient planted at iteration 3
on the last rank (under FSDP1 in its flat parameter's shard, under ZeRO in
a module parameter whose gradient the hooks reduce), then resumes to
iteration 8. The incident is diagnosed (a replay of the batch), except
under FSDP1, where the report says why not. One more cell runs mmdet's
own ``tools/train.py`` under ``torchrun`` with the include in the
config.

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
    runner='NanGuardRunner',
    fsdp2='NanGuardRunner',
    **{m: 'NanGuardFlexibleRunner' for m in FLEXIBLE},
)
PLAIN = dict(
    runner='Runner', fsdp2='Runner', **{m: 'FlexibleRunner' for m in FLEXIBLE}
)
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


def _run(way, mode, nproc, work, max_iters, *extra, ok=True):
    out = run_script(
        torchrun_args(nproc, free_port())
        + [WORKER, way, mode, str(work), str(max_iters), *extra],
        timeout=300,
        env=dict(OMP_NUM_THREADS='1'),
    )
    log = out.stdout + out.stderr
    assert (out.returncode == 0) == ok, log[-6000:]
    return log


def _first_run(way, mode, nproc, work) -> list:
    """Train 6 iterations; check the runner built, the one skipped
    incident on every rank and its diagnosis, and the same finite weights
    on every rank; return those weights."""
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
        # diagnosed, or (FSDP1) its reason why not; never a failure. The
        # hook alone has no diagnosis (the protected runner adds it)
        assert 'diagnosis_error' not in report, report['diagnosis_error']
        if way == 'hook':
            assert 'diagnosis' not in report
        elif mode == 'fsdp1':
            assert report['diagnosis_skipped'].startswith('no replay under')
        else:
            assert report['diagnosis']['verdict'], report

    weights = [
        torch.load(str(work / f'weights_rank{r}.pth'), map_location='cpu')
        for r in range(nproc)
    ]
    assert tensors_all_finite(weights[0])
    for other in weights[1:]:
        assert other.keys() == weights[0].keys()
        assert all(torch.equal(other[k], weights[0][k]) for k in other)
    # written under a temporary name and renamed: none is left
    assert not [n for n in os.listdir(work) if 'nanguard-tmp' in n]
    return weights


@pytest.mark.parametrize('way,mode,nproc', CELLS)
def test_way_in_checkpoints_fault_and_resume(way, mode, nproc, tmp_path):
    work = tmp_path / 'work'
    work.mkdir()
    weights = _first_run(way, mode, nproc, work)

    for step in (2, 4, 6):
        ckpt = _checkpoint(work, step, mode)
        assert ckpt['meta']['iter'] == step
        assert tensors_all_finite(ckpt['state_dict'])
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


@pytest.mark.parametrize('way', WAYS)
def test_way_in_under_fsdp2_and_its_resume_refused(way, tmp_path):
    """mmengine's ``Runner`` with the model sharded by torch's FSDP2
    (``model_wrapper_cfg``; mmengine 0.10.7 has no FSDP2 of its own): the
    fault is skipped on both ranks and diagnosed (rank 1 holds empty
    shards of the toy's parameters: the diagnosis failed there), the
    weights are the same; the checkpoints hold rank 0's DTensor shards,
    and the resume refuses them with the fix before anything is loaded
    (mmengine resumed rank 0's shards and momentum on every rank, and the
    step after failed with a shape mismatch)."""
    work = tmp_path / 'work'
    work.mkdir()
    weights = _first_run(way, 'fsdp2', 2, work)
    assert sorted(n for n in os.listdir(work) if n.startswith('iter_')) == [
        'iter_2.pth',
        'iter_4.pth',
        'iter_6.pth',
    ]

    log = _run(way, 'fsdp2', 2, work, 8, 'resume', ok=False)
    assert 'holds the DTensor shards of one rank' in log, log[-6000:]
    assert "FSDPStrategy(state_dict_cfg='full')" in log
    assert "doesn't match the broadcast shape" not in log
    assert not (work / 'iter_8.pth').exists()
    after = torch.load(str(work / 'weights_rank0.pth'), map_location='cpu')
    assert all(torch.equal(after[k], weights[0][k]) for k in after)


def _upstream_config(tmp_path, work) -> str:
    """A config with the include, as a user writes it for an upstream
    ``tools/train.py``: the toy run of the ways-in cells (the fault on rank
    1) as a base file, the include, and ``custom_imports`` for the toy
    model and for ``FaultInjectionHook`` (``mmnanguard.testing``)."""
    from ways_in_worker import build_cfg

    base = build_cfg('upstream', 'runner', str(work), 6, False)
    base.custom_hooks[0]['rank'] = 1
    base.dump(str(tmp_path / 'toy_run.py'))
    config = tmp_path / 'protected.py'
    config.write_text(
        "_base_ = ['./toy_run.py', 'mmnanguard::_base_/nanguard.py']\n"
        "custom_imports = dict(imports=['ways_in_toy', 'mmnanguard.testing'],"
        ' allow_failed_imports=False)\n'
    )
    return str(config)


def test_upstream_train_script_under_ddp(tmp_path):
    """mmdet's own ``tools/train.py`` (shipped in ``mmdet/.mim``, not
    modified) with ``--launcher pytorch`` on 2 processes, the config with
    the include: the runner it builds is the protected one (on this CPU
    machine it starts gloo itself), the NaN gradient on rank 1 is one
    skipped incident on both ranks, the checkpoints are finite, and
    ``--resume`` continues."""
    import mmdet

    script = osp.join(osp.dirname(mmdet.__file__), '.mim', 'tools', 'train.py')
    work = tmp_path / 'work'
    work.mkdir()
    config = _upstream_config(tmp_path, work)

    def train(max_iters, *extra):
        out = run_script(
            torchrun_args(2, free_port())
            + ['-m', 'mmnanguard', script, config, '--launcher', 'pytorch']
            + ['--work-dir', str(work), *extra, '--cfg-options']
            + [f'train_cfg.max_iters={max_iters}'],
            timeout=300,
            env=dict(OMP_NUM_THREADS='1', PYTHONPATH=HERE),
        )
        log = out.stdout + out.stderr
        assert out.returncode == 0, log[-6000:]
        return log

    train(6)
    reports = [
        json.load(open(p))
        for p in glob.glob(str(work / 'nanguard' / '*' / 'report.json'))
    ]
    assert sorted(r['rank'] for r in reports) == [0, 1]
    for report in reports:
        assert (report['kind'], report['iteration']) == ('nonfinite_grad', 3)
        assert report['action'] == 'skip'
    for step in (2, 4, 6):
        ckpt = _checkpoint(work, step, 'runner')
        assert ckpt['meta']['iter'] == step
        assert tensors_all_finite(ckpt['state_dict'])
    log = train(8, '--resume')
    assert 'resumed epoch: 0, iter: 6' in log, log[-6000:]
    resumed = _checkpoint(work, 8, 'runner')
    assert tensors_all_finite(resumed['state_dict'])
    assert not all(
        torch.equal(resumed['state_dict'][k], v)
        for k, v in _checkpoint(work, 6, 'runner')['state_dict'].items()
    )
