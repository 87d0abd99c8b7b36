# Copyright (c) mmnanguard contributors. All rights reserved.
"""The include under ``FlexibleRunner`` + ``DeepSpeedStrategy`` (ZeRO-1 and
ZeRO-2, fp32), 2 CPU processes over gloo, faults planted on rank 1 only.

The config has the include and its own ``runner_type='FlexibleRunner'``
(the protected counterpart is built) and trains the toy model with SGD and
momentum: the scope here is the optim wrapper, the snapshots and the
checkpoint checks under ZeRO, not a detector.

* Iteration 1: an inf loss on rank 1 -> the step is dropped on both ranks;
  each rank's fp32 partition and momentum are unchanged by it.
* Iteration 3: an inf loss and a NaN in rank 1's momentum partition: the
  step is dropped, the NaN stays in ZeRO's partition, where the strategy's
  ``state_dict`` (what rank 0 saves as client state) does not see it. The
  check before ``iter_4`` reads every rank's partition: both ranks roll
  back from memory, the partition state (fp32 master copy and momentum) is
  restored to what it was before iteration 3, and ``iter_4``'s
  ``zero_pp_rank_1_*_optim_states.pt`` holds no NaN.
* (ZeRO-2) A resume from ``iter_6`` continues to 8 with the guard's
  counters.
"""

import glob
import json
import os
import os.path as osp

import pytest
import torch
from integration_utils import run_script

from mmnanguard.fileio.durable_folder import TEMP_FOLDER_SUFFIX
from mmnanguard.testing.distributed import (
    free_port,
    incidents_by_rank,
    torchrun_args,
)

pytest.importorskip(
    'deepspeed',
    reason='deepspeed is installed in the development stack only '
    '(tools/setup/stacks/rotate.txt); the other stacks do not test it',
)

HERE = osp.dirname(osp.abspath(__file__))
WORKER = osp.join(HERE, 'deepspeed_worker.py')

pytestmark = pytest.mark.slow


def _config(tmp_path, stage: int, max_iters: int, resume: bool) -> str:
    config = tmp_path / f'deepspeed_zero{stage}_{max_iters}.py'
    config.write_text(
        '_base_ = ["mmnanguard::_base_/nanguard.py"]\n'
        "runner_type = 'FlexibleRunner'\n"
        "default_scope = 'mmengine'\n"
        "strategy = dict(type='DeepSpeedStrategy',\n"
        f'    zero_optimization=dict(stage={stage}),\n'
        '    config=dict(zero_allow_untested_optimizer=True))\n'
        "model = dict(type='ToyModel')\n"
        "env_cfg = dict(dist_cfg=dict(backend='gloo'))\n"
        "train_dataloader = dict(dataset=dict(type='ToyDataset'),\n"
        "    sampler=dict(type='DefaultSampler', shuffle=False),\n"
        "    collate_fn=dict(type='default_collate'),\n"
        '    batch_size=2, num_workers=0)\n'
        "optim_wrapper = dict(type='DeepSpeedOptimWrapper',\n"
        "    optimizer=dict(type='SGD', lr=0.05, momentum=0.9))\n"
        f'train_cfg = dict(by_epoch=False, max_iters={max_iters})\n'
        'default_hooks = dict(\n'
        "    logger=dict(type='LoggerHook', interval=1),\n"
        "    checkpoint=dict(type='CheckpointHook', interval=2,"
        ' by_epoch=False))\n'
        'log_processor = dict(by_epoch=False, window_size=1)\n'
        'randomness = dict(seed=0)\n'
        "custom_imports = dict(imports=['mmnanguard.testing'],"
        ' allow_failed_imports=False)\n'
        'custom_hooks = [\n'
        # first: the faults' hook is HIGHEST too, and registered after it
        "    dict(type='ZeroStateRecorder', iterations=[1, 3],"
        " when='before', priority='HIGHEST'),\n"
        "    dict(type='FaultInjectionHook', fault='inf_loss', iteration=1,"
        ' rank=1),\n'
        "    dict(type='FaultInjectionHook', fault='inf_loss', iteration=3,"
        ' rank=1),\n'
        "    dict(type='FaultInjectionHook', fault='nan_optimizer_state',"
        ' iteration=3, rank=1),\n'
        "    dict(type='ZeroStateRecorder', iterations=[1, 3],"
        " when='after', priority='LOWEST'),\n"
        ']\n'
        'nanguard = dict(snapshot_interval=1, hooks=[])\n'
        f'resume = {resume}\n'
    )
    return str(config)


def _train(tmp_path, work, stage: int, max_iters: int, resume: bool):
    config = _config(tmp_path, stage, max_iters, resume)
    out = run_script(
        torchrun_args(2, free_port()) + [WORKER, config, str(work)],
        timeout=600,
        env=dict(OMP_NUM_THREADS='1'),
    )
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-8000:]
    return log


def _load(path):
    # a file this test's run just wrote
    return torch.load(str(path), map_location='cpu', weights_only=False)


def _all_finite(tree) -> bool:
    if isinstance(tree, torch.Tensor):
        return not tree.is_floating_point() or bool(tree.isfinite().all())
    if isinstance(tree, dict):
        return all(_all_finite(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return all(_all_finite(v) for v in tree)
    return True


def _same(a: dict, b: dict) -> bool:
    return all(
        len(a[k]) == len(b[k])
        and all(torch.equal(x, y) for x, y in zip(a[k], b[k]))
        for k in ('fp32', 'momentum')
    )


@pytest.mark.parametrize('stage, resume', [(1, False), (2, True)])
def test_deepspeed_skip_partition_check_and_resume(tmp_path, stage, resume):
    work = tmp_path / 'work'
    log = _train(tmp_path, work, stage, max_iters=6, resume=False)
    assert (
        'nanguard: rolled back to the state of iteration 3 (from memory)'
        in log
    ), log[-4000:]
    # the same incidents, in the same order, on both ranks
    by_rank = incidents_by_rank(work)
    assert by_rank[0] == by_rank[1], by_rank
    assert by_rank[0] == [
        (1, 'nonfinite_loss', 'skip'),
        (3, 'nonfinite_loss', 'skip'),
        (3, 'nonfinite_checkpoint', 'rollback'),
    ], by_rank
    report = json.load(
        open(glob.glob(str(work / 'nanguard' / '*_rank1' / 'report.json'))[-1])
    )
    assert any('zero' in t for t in report['nonfinite_tensors']), report
    for rank in (0, 1):
        # a dropped step leaves the partition and the momentum as they were
        one = [
            _load(work / f'zero_iter1_rank{rank}_{w}.pth')
            for w in ('before', 'after')
        ]
        assert one[0]['momentum'], 'SGD momentum after iteration 0'
        assert _same(*one), rank
        # iteration 3: dropped, rank 1's momentum poisoned, the check
        # before iter_4 rolled back to the state before iteration 3
        three = [
            _load(work / f'zero_iter3_rank{rank}_{w}.pth')
            for w in ('before', 'after')
        ]
        assert _same(*three), rank
        assert _all_finite(three[1]), rank
    # the checkpoint written after the rollback holds no NaN in any
    # rank's partition
    files = glob.glob(str(work / 'iter_4.pth' / '*optim_states.pt'))
    assert len(files) == 2, files
    # every checkpoint folder was written under a temporary name, published
    # once both ranks had written their partitions
    assert not [n for n in os.listdir(work) if n.endswith(TEMP_FOLDER_SUFFIX)]
    for path in files:
        assert _all_finite(_load(path)['optimizer_state_dict']), path
    weights = [_load(work / f'weights_rank{r}.pth') for r in (0, 1)]
    for name, value in weights[0].items():
        assert torch.equal(value, weights[1][name]), name
        assert bool(value.isfinite().all()), name
    if not resume:  # the resume is the strategy's, the same for ZeRO-1
        return
    # a protected resume continues from iter_6, with the guard's counters
    log = _train(tmp_path, work, stage, max_iters=8, resume=True)
    # resumed from the folder iter_6.pth (before the checks of folder
    # checkpoints, the resume passed over it and trained from scratch:
    # the faults of iterations 1 and 3 fired again)
    assert f"resuming from '{work}/iter_6.pth'" in log, log[-4000:]
    assert 'resumed epoch: 0, iter: 6' in log, log[-4000:]
    assert 'training starts from scratch' not in log
    assert "'incidents': 3" in log, log[-4000:]
    # the fault of iteration 1 fired once, in the first run
    assert len(glob.glob(str(work / 'nanguard' / '*_iter000001_rank0'))) == 1
    assert osp.isdir(work / 'iter_8.pth')
    resumed = [_load(work / f'weights_rank{r}.pth') for r in (0, 1)]
    for name, value in resumed[0].items():
        assert torch.equal(value, resumed[1][name]), name
        assert bool(value.isfinite().all()), name
    # iterations 6 and 7 trained: the weights moved on from iter_6's
    assert any(
        not torch.equal(value, weights[0][name])
        for name, value in resumed[0].items()
    )
