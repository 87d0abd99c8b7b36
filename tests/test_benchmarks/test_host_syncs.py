# Copyright (c) mmnanguard contributors. All rights reserved.
"""The guard's budget of host reads and collectives, pinned.

The instrument is :func:`mmnanguard.testing.host_syncs.count_host_syncs`,
the one ``benchmarks/host_syncs.py`` uses. Each budget test trains the
tiny config through ``tools/train.py`` in this process, ``--guard off``
and ``--guard skip`` (same seed, same batches), and compares the steady
state (the first 2 of 3 iterations left out; 128 px images, 96 px under
AMP, to stay within the time of a test). Per iteration, over bare
mmengine:

* 0 added host reads with ``clip_grad`` (tiny rotated RetinaNet DOTA);
* at most 1 without ``clip_grad`` (tiny RetinaNet COCO);
* at most 1 under CPU AMP (``--amp``: ``CPUAmpOptimWrapper``);
* at most 1 added collective under 2-process gloo DDP.

A failure names every site whose count differs from bare.
"""

import json
import os
import os.path as osp
import socket
import subprocess
import sys

import pytest
import torch
from mmengine.hooks import Hook
from mmengine.runner import Runner

from mmnanguard.testing.host_syncs import SyncCounts, count_host_syncs
from mmnanguard.testing.toy import toy_runner_cfg

BENCHMARKS = osp.join(
    osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))), 'benchmarks'
)
sys.path.insert(0, BENCHMARKS)

import host_syncs as bench  # noqa: E402

ITERS = 3  # the first 2 left out
#: variant -> image size (fp16 convolutions are slow on the CPU)
IMG_SCALE = dict(fp32=128, amp=96, ddp=128)


# -- the instrument ---------------------------------------------------------
def test_counter_counts_three_items_and_one_tolist_as_four():
    x = torch.arange(6.0, requires_grad=True)
    with count_host_syncs() as counts:
        for i in range(3):
            (x * i).sum().item()
        x.detach().tolist()
        (x * 2).sum().backward()  # no read
        torch.nn.utils.clip_grad_norm_([x], 1.0)  # no read either
    assert counts.reads == 4
    assert counts.category('scalar') == 3
    assert counts.category('copy') == 1
    assert counts.category('shape') == 0
    assert counts.collectives == 0
    assert sorted(counts.sites().values()) == [1, 3]
    assert all(site.startswith('tests/') for site in counts.sites())
    assert 'tolist' not in torch.Tensor.__dict__  # restored


def test_counter_sees_each_kind_of_read_once():
    y = torch.arange(6.0) - 2
    kinds = dict(
        scalar=[
            lambda: float(y.sum()),
            lambda: bool(y.sum() > 0),
            lambda: int(y.sum()),
            lambda: torch.equal(y, y),
        ],
        shape=[
            lambda: y[y > 0],
            lambda: y.clone().__setitem__(y > 0, 0.0),
            lambda: torch.nonzero(y),
            lambda: torch.where(y > 0),
            lambda: torch.unique(y),
            lambda: y.masked_select(y > 0),
            lambda: torch.repeat_interleave(torch.tensor([1, 2])),
        ],
        copy=[lambda: y.numpy(), lambda: y.cpu(), lambda: y.tolist()],
    )
    for kind, calls in kinds.items():
        for call in calls:
            with count_host_syncs() as counts:
                call()
            assert (counts.reads, counts.category(kind)) == (1, 1), (
                kind,
                dict(counts.events),
            )
    with count_host_syncs() as counts:  # fixed shapes: no read
        y[torch.tensor([0, 1])]
        torch.repeat_interleave(torch.tensor([1, 2]), output_size=3)
        torch.where(y > 0, y, 0.0)
    assert counts.reads == 0, dict(counts.events)


class TwoReads(Hook):
    """Two host reads in every iteration (after the step)."""

    def after_train_iter(
        self, runner, batch_idx, data_batch=None, outputs=None
    ):
        loss = outputs['loss']
        float(loss)
        loss.detach().tolist()


def _toy_counts(tmp_path, name, hooks) -> SyncCounts:
    runner = Runner(
        **toy_runner_cfg(
            str(tmp_path / name),
            max_iters=5,
            custom_hooks=hooks,
            default_hooks=dict(checkpoint=None),
        )
    )
    with count_host_syncs() as counts:
        runner.train()
    return counts


def test_counter_splits_iterations(tmp_path):
    bare = _toy_counts(tmp_path, 'bare', [])
    more = _toy_counts(tmp_path, 'more', [TwoReads()])
    assert len(bare.iterations) == len(more.iterations) == 5
    b, m = bare.per_iteration(2), more.per_iteration(2)
    assert m['reads'] - b['reads'] == 2
    assert m['reads_each'] == [r + 2 for r in b['reads_each']]
    own = {s: n for s, n in m['read_sites'].items() if s.startswith('tests/')}
    assert list(own.values()) == [1, 1], own


# -- the budget ---------------------------------------------------------------
@pytest.fixture(scope='module')
def count(tmp_path_factory, tiny_dota_root, tiny_coco_root):
    """``count(config, variant, mode)``: per-iteration counts, cached."""
    cache = {}

    def run(config, variant, mode):
        key = (config, variant, mode)
        if key not in cache:
            work_dir = str(tmp_path_factory.mktemp('_'.join(key)))
            root = tiny_coco_root if config == 'coco' else tiny_dota_root
            path = bench.prepare_config(
                config,
                variant,
                mode,
                root,
                work_dir,
                iters=ITERS,
                img_scale=IMG_SCALE[variant],
            )
            cache[key] = bench.count_training(
                bench.train_args(path, mode, variant, work_dir)
            )
        return cache[key]

    return run


def _added(count, config, variant):
    bare = count(config, variant, 'bare')
    guard = count(config, variant, 'include')
    results = [dict(bare, config=config, variant=variant, mode='bare')]
    results.append(dict(guard, config=config, variant=variant, mode='include'))
    bench.added_over_bare(results)
    added = results[1]
    return added['added_reads'], added['added_collectives'], added


def _explain(added) -> str:
    return (
        f"{added['added_reads']:+.2f} reads/iter "
        f"(bare {added['reads'] - added['added_reads']:.2f}); sites vs "
        f"bare: {added['site_diff']}"
    )


@pytest.mark.slow
def test_no_added_host_read_with_clip_grad(count):
    reads, _, added = _added(count, 'dota', 'fp32')
    assert reads <= 0, _explain(added)


@pytest.mark.slow
def test_at_most_one_added_host_read_without_clip_grad(count):
    reads, _, added = _added(count, 'coco', 'fp32')
    assert reads <= 1, _explain(added)


@pytest.mark.slow
def test_at_most_one_added_host_read_under_cpu_amp(count):
    reads, _, added = _added(count, 'dota', 'amp')
    assert reads <= 1, _explain(added)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def _ddp_counts(tmp_path, root, mode):
    path = bench.prepare_config(
        'dota',
        'ddp',
        mode,
        root,
        str(tmp_path / mode),
        iters=ITERS,
        img_scale=IMG_SCALE['ddp'],
    )
    out = str(tmp_path / f'{mode}.json')
    cmd = [
        sys.executable,
        '-m',
        'torch.distributed.run',
        '--nproc_per_node',
        '2',
        '--master_port',
        str(_free_port()),
        osp.join(BENCHMARKS, 'host_syncs.py'),
        '--worker',
        out,
    ] + bench.train_args(path, mode, 'ddp', str(tmp_path / mode))
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, OMP_NUM_THREADS='1', PYTHONWARNINGS='ignore'),
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    with open(f'{out}.rank0') as f:
        return json.load(f)


@pytest.mark.slow
def test_at_most_one_added_collective_under_ddp(tmp_path, tiny_dota_root):
    results = [
        dict(
            _ddp_counts(tmp_path, tiny_dota_root, mode),
            config='dota',
            variant='ddp',
            mode=mode,
        )
        for mode in ('bare', 'include')
    ]
    bench.added_over_bare(results)
    added = results[1]
    assert results[0]['collectives'] >= 1  # DDP's gradient all-reduce
    assert added['added_collectives'] <= 1, (
        f"{added['added_collectives']:+.2f} collectives/iter; sites vs "
        f"bare: {added['site_diff']}"
    )
