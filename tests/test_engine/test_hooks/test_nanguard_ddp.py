# Copyright (c) mmnanguard contributors. All rights reserved.
"""Two gloo processes on the CPU, a fault on rank 1 only: both ranks take
the same action, nobody hangs, and both finish."""

import json
import os
import os.path as osp
import socket

import pytest
import torch
import torch.multiprocessing as mp

MAX_ITERS = 4
FAULT_ITER = 1


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def _worker(
    rank,
    world_size,
    port,
    work_dir,
    data_root,
    policy,
    fault,
    fault_iter=FAULT_ITER,
    overrides=None,
):
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        MASTER_ADDR='127.0.0.1',
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    from mmengine.runner import Runner

    import mmnanguard  # noqa: F401
    from mmnanguard.compat.cpu_distributed import prepare_cpu_distributed
    from mmnanguard.engine.hooks import NanGuardHook
    from mmnanguard.engine.runner.process_group_close import (
        close_process_group,
    )
    from mmnanguard.testing import TINY_DOTA_CONFIG, load_tiny_config

    cfg = load_tiny_config(
        TINY_DOTA_CONFIG,
        work_dir,
        data_root,
        max_iters=MAX_ITERS,
        launcher='pytorch',
        custom_hooks=[
            dict(
                type='FaultInjectionHook',
                fault=fault,
                iteration=fault_iter,
                rank=1,
            ),
            dict(type='NanGuardHook', policy=policy, snapshot_interval=1),
        ],
        **(overrides or {}),
    )
    cfg.env_cfg.dist_cfg = dict(backend='gloo')
    assert prepare_cpu_distributed(cfg, 'pytorch')
    runner = Runner.from_cfg(cfg)
    runner.train()
    guard = next(h for h in runner.hooks if isinstance(h, NanGuardHook))
    checksum = float(sum(p.double().sum() for p in runner.model.parameters()))
    with open(osp.join(work_dir, f'rank{rank}.json'), 'w') as f:
        json.dump(
            dict(
                iter=runner.iter,
                counters=guard.counters,
                report=guard.last_report.to_dict(),
                checksum=checksum,
            ),
            f,
            default=str,
        )
    close_process_group(completed=True)


@pytest.mark.parametrize(
    'policy, fault', [('skip', 'inf_loss'), ('rollback', 'nan_grad')]
)
def test_fault_on_rank1_both_ranks_agree(
    tmp_path, tiny_dota_root, policy, fault
):
    work_dir = str(tmp_path)
    mp.start_processes(
        _worker,
        args=(2, _free_port(), work_dir, tiny_dota_root, policy, fault),
        nprocs=2,
        join=True,
        start_method='spawn',
    )
    results = [
        json.load(open(osp.join(work_dir, f'rank{r}.json'))) for r in (0, 1)
    ]
    for result in results:
        assert result['iter'] == MAX_ITERS
        report = result['report']
        assert report['iteration'] == FAULT_ITER
        assert report['action'] == policy
        assert report['world_size'] == 2
    assert results[1]['report']['local_fault'] is True
    # a non-finite loss term (+inf, a constant: its gradients are finite)
    # stays on its rank and reaches the others through the guard's vote;
    # NaN gradients reach every rank through DDP's gradient all-reduce
    assert results[0]['report']['local_fault'] is (fault == 'nan_grad')
    assert results[0]['counters'] == results[1]['counters']
    # the replicas are still identical: nobody stepped alone
    assert results[0]['checksum'] == pytest.approx(
        results[1]['checksum'], rel=0, abs=1e-9
    )


def test_params_check_read_at_the_end_blames_the_faulty_rank_only(
    tmp_path, tiny_dota_root
):
    """A NaN momentum on rank 1 in the last iteration turns rank 1's
    weights NaN, not rank 0's. No later step reads that parameter check:
    it is read after training (the read of a pending check, also used
    before a checkpoint). Both ranks roll back; only rank 1 saw it."""
    work_dir = str(tmp_path)
    last = MAX_ITERS - 1
    momentum = dict(optim_wrapper=dict(optimizer=dict(momentum=0.9)))
    mp.start_processes(
        _worker,
        args=(
            2,
            _free_port(),
            work_dir,
            tiny_dota_root,
            'rollback',
            'nan_optimizer_state',
            last,
            momentum,
        ),
        nprocs=2,
        join=True,
        start_method='spawn',
    )
    results = [
        json.load(open(osp.join(work_dir, f'rank{r}.json'))) for r in (0, 1)
    ]
    reports = [result['report'] for result in results]
    assert [r['kind'] for r in reports] == ['nonfinite_params'] * 2
    assert [r['action'] for r in reports] == ['rollback'] * 2
    assert [r['local_fault'] for r in reports] == [False, True]
    assert results[0]['checksum'] == pytest.approx(
        results[1]['checksum'], rel=0, abs=1e-9
    )
