# Copyright (c) mmnanguard contributors. All rights reserved.
"""The include under ``FlexibleRunner`` + mmengine's ``FSDPStrategy``
(torch FSDP1), 2 CPU processes over gloo, with the CPU mends of
:mod:`mmnanguard.compat.fsdp1_cpu`; faults planted on rank 1 only.

The model is the toy (two linear heads, 10 parameters): FSDP1 flattens
them into one parameter of which each rank holds 5 (rank 0 ``a.*``, rank
1 ``b.*``), so a fault in rank 1's momentum reaches rank 1's shard only.

``state_dict_cfg='full'``: iteration 1 an inf loss on rank 1, skipped on
both ranks; iteration 3 a NaN in rank 1's momentum, so the step turns
``b.weight`` NaN on rank 1; the check before ``iter_4.pth`` is agreed on
both ranks, which roll back from ``iter_2.pth`` (full tensors, loaded
through FSDP's state-dict API) before rank 0 writes ``iter_4.pth``. A
second run resumes from that ``iter_4.pth`` (the protected resume) to
iteration 6 and ends with the very weights of the first run.

``state_dict_cfg='local'`` (mmengine's default): the same faults; every
rank checks its ``ShardedTensor`` shards before each local checkpoint
(this crashed with ``isfinite ... ShardedTensor``), and the rollback takes
the in-memory snapshot of iteration 0 on both ranks; ``max_keep_ckpts``
removes the oldest checkpoint folder.
"""

import os
import os.path as osp
import re
import shutil

import pytest
import torch
from integration_utils import run_script

from mmnanguard.fileio.durable_folder import TEMP_FOLDER_SUFFIX
from mmnanguard.testing.distributed import (
    free_port,
    incidents_by_rank,
    torchrun_args,
)
from mmnanguard.testing.toy import TOY_DATASET, TOY_MODEL

HERE = osp.dirname(osp.abspath(__file__))

pytestmark = pytest.mark.slow

FAULTS = (
    "custom_imports = dict(imports=['mmnanguard.testing'],"
    ' allow_failed_imports=False)\n'
    'custom_hooks = [\n'
    "    dict(type='FaultInjectionHook', fault='inf_loss', iteration=1,"
    ' rank=1),\n'
    "    dict(type='FaultInjectionHook', fault='nan_optimizer_state',"
    ' iteration=3, rank=1),\n'
    ']\n'
)


def _config(
    path, state_dict_cfg: str, rollback_source: str, faults=True, keep=-1
):
    path.write_text(
        '_base_ = ["mmnanguard::_base_/nanguard.py"]\n'
        "runner_type = 'FlexibleRunner'\n"
        "strategy = dict(type='FSDPStrategy', "
        f'state_dict_cfg={state_dict_cfg!r})\n'
        f'model = dict(type={TOY_MODEL!r})\n'
        'train_dataloader = dict(\n'
        f'    dataset=dict(type={TOY_DATASET!r}),\n'
        "    sampler=dict(type='DefaultSampler', shuffle=False),\n"
        "    collate_fn=dict(type='default_collate'),\n"
        '    batch_size=2, num_workers=0)\n'
        "optim_wrapper = dict(type='OptimWrapper',\n"
        "    optimizer=dict(type='SGD', lr=0.01, momentum=0.9))\n"
        'train_cfg = dict(by_epoch=False, max_iters=6)\n'
        "default_hooks = dict(logger=dict(type='LoggerHook', interval=1),\n"
        "    checkpoint=dict(type='CheckpointHook', interval=2,"
        f' by_epoch=False, max_keep_ckpts={keep}))\n'
        'log_processor = dict(by_epoch=False, window_size=1)\n'
        'randomness = dict(seed=0)\n'
        "default_scope = 'mmengine'\n"
        "env_cfg = dict(dist_cfg=dict(backend='gloo'))\n"
        + (FAULTS if faults else '')
        + f'nanguard = dict(rollback_source={rollback_source!r}, '
        'snapshot_interval=2, hooks=[])\n'
    )
    return str(path)


def _run(config, work):
    out = run_script(
        torchrun_args(2, free_port())
        + [osp.join(HERE, 'dist_worker.py'), config, str(work), 'every_iter'],
        timeout=240,
        env=dict(OMP_NUM_THREADS='1'),
    )
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-6000:]
    return log


def _load(path):
    return torch.load(str(path), map_location='cpu', weights_only=False)


def _assert_skip_then_rollback(work):
    """Both ranks: the inf loss skipped, the NaN parameters rolled back."""
    by_rank = incidents_by_rank(work)
    assert by_rank[0] == by_rank[1], by_rank
    assert by_rank[0] == [
        (1, 'nonfinite_loss', 'skip'),
        (3, 'nonfinite_params', 'rollback'),
    ]


def _assert_equal_states(actual, expected):
    assert actual.keys() == expected.keys()
    for name, value in expected.items():
        assert torch.equal(actual[name], value), name
        assert torch.isfinite(value).all(), name


def test_fsdp1_full_state_skip_checkpoint_rollback_and_resume(tmp_path):
    config = _config(tmp_path / 'fsdp1_full.py', 'full', 'checkpoint')
    work = tmp_path / 'work'
    log = _run(config, work)
    _assert_skip_then_rollback(work)
    assert (
        f'rolled back to the state of iteration 2 (from {work}/iter_2.pth)'
        in log
    ), log[-4000:]
    # rank 0 wrote full state dicts, durably (one file, no temporary one
    # left); iter_4.pth holds the restored state
    assert osp.isfile(work / 'iter_4.pth')
    assert not [n for n in os.listdir(work) if 'nanguard-tmp' in n]
    first, restored = _load(work / 'iter_2.pth'), _load(work / 'iter_4.pth')
    assert first['state_dict']['a.weight'].shape == (1, 4)
    _assert_equal_states(restored['state_dict'], first['state_dict'])
    for key, state in first['optimizer']['state'].items():
        _assert_equal_states(restored['optimizer']['state'][key], state)
    # both ranks started iteration 4 with it (gathered by the worker)
    for rank in (0, 1):
        _assert_equal_states(
            _load(work / f'iter4_rank{rank}.pth'), first['state_dict']
        )
    final = _load(work / 'weights_rank0.pth')
    _assert_equal_states(_load(work / 'weights_rank1.pth'), final)

    # the protected resume from iter_4.pth continues bit-identically
    resumed = tmp_path / 'resumed'
    resumed.mkdir()
    shutil.copy(work / 'iter_4.pth', resumed / 'iter_4.pth')
    (resumed / 'last_checkpoint').write_text(str(resumed / 'iter_4.pth'))
    config = _config(tmp_path / 'fsdp1_resume.py', 'full', 'checkpoint')
    with open(config, 'a') as f:
        f.write('resume = True\n')
    log = _run(config, resumed)
    assert re.search(r'[Rr]esum\w* .*iter_4\.pth', log), log[-4000:]
    assert incidents_by_rank(resumed) == {0: [], 1: []}
    for rank in (0, 1):
        _assert_equal_states(_load(resumed / f'weights_rank{rank}.pth'), final)


def test_fsdp1_local_state_sharded_check_and_memory_rollback(tmp_path):
    config = _config(tmp_path / 'fsdp1_local.py', 'local', 'memory', keep=2)
    work = tmp_path / 'work'
    log = _run(config, work)
    _assert_skip_then_rollback(work)
    # each rank wrote its shards, every one checked before the write, into
    # a temporary folder published once both had written; max_keep_ckpts=2
    # removed the folder iter_2.pth once iter_6.pth was written (before,
    # the rotation kept every checkpoint folder)
    assert not osp.exists(work / 'iter_2.pth')
    for step in (4, 6):
        assert sorted(os.listdir(work / f'iter_{step}.pth')) == [
            'rank0.pth',
            'rank1.pth',
        ]
    assert (work / 'last_checkpoint').read_text() == str(work / 'iter_6.pth')
    assert not [n for n in os.listdir(work) if n.endswith(TEMP_FOLDER_SUFFIX)]
    restored = re.findall(
        r'rolled back to the state of iteration (\d+) \(from memory\)', log
    )
    # snapshot_interval=2: the one due after iteration 1 was not taken (its
    # step was skipped), the one after iteration 3 never confirmed
    assert set(restored) == {'0'}, log[-4000:]
    reference = _load(work / 'iter0_rank0.pth')
    for rank in (0, 1):
        _assert_equal_states(_load(work / f'iter0_rank{rank}.pth'), reference)
        _assert_equal_states(_load(work / f'iter4_rank{rank}.pth'), reference)
    _assert_equal_states(
        _load(work / 'weights_rank1.pth'), _load(work / 'weights_rank0.pth')
    )
