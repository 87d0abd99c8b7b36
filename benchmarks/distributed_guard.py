# Copyright (c) mmnanguard contributors. All rights reserved.
"""The guard under DDP and under FSDP2: collectives per iteration and the
interleaved overhead, 2 CPU processes over gloo.

Each run trains mmdet's RetinaNet (tiny config: ResNet-18, generated COCO
images, ``IterBasedTrainLoop``) with ``torchrun --nproc_per_node 2``:

* ``ddp``: mmengine's ``Runner`` with ``MMDistributedDataParallel``;
* ``fsdp2``: mmengine's ``Runner`` with the model sharded by torch's
  ``fully_shard`` (:mod:`mmnanguard.testing.fsdp2`): parameters, gradients
  and optimizer states are DTensors;

each with the guard off (``--guard off``) and on (``--guard skip``: the
include's defaults), with and without ``clip_grad``. Per iteration (the
first 2 left out) rank 0 counts every collective and host read
(:func:`mmnanguard.testing.host_syncs.count_host_syncs`), reads the
process group's sequence number after each iteration (every collective of
the group, also those a DTensor issues inside its own dispatch, which a
``TorchDispatchMode`` does not see) and times the iteration. Guard-on
and guard-off runs alternate (ABBA...), so that a slow phase of this
shared 2-core machine hits both; the ratio is the median of the per-pair
ratios of median iteration times, with the lowest
and highest pair.

Usage::

    python benchmarks/distributed_guard.py --pairs 3 \
        --out benchmarks/distributed_guard.json
"""

import argparse
import json
import os
import os.path as osp
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

ITERS = 8
SKIP = 2
PROCS = 2


def _worker(out: str, data_root: str, sharding: str, guard: str, clip: str):
    """One rank: train, count and time; write ``out.rank{RANK}``."""
    import torch.distributed as torch_dist
    from mmengine.hooks import Hook
    from mmengine.registry import RUNNERS

    import mmnanguard  # noqa: F401
    from mmnanguard.compat.cpu_distributed import prepare_cpu_distributed
    from mmnanguard.engine.runner.process_group_close import (
        close_process_group,
    )
    from mmnanguard.engine.runner.train_options import apply_guard_option
    from mmnanguard.testing import load_tiny_config
    from mmnanguard.testing.host_syncs import count_host_syncs
    from mmnanguard.testing.tiny_configs import TINY_COCO_CONFIG

    work_dir = osp.dirname(out)
    cfg = load_tiny_config(
        TINY_COCO_CONFIG, work_dir, data_root, max_iters=ITERS
    )
    cfg.default_hooks.checkpoint = dict(
        type='CheckpointHook', interval=10**6, by_epoch=False, save_last=False
    )
    cfg.optim_wrapper.clip_grad = (
        dict(max_norm=35, norm_type=2) if clip == 'clip' else None
    )
    cfg.launcher = 'pytorch'
    apply_guard_option(cfg, guard)
    prepare_cpu_distributed(cfg, 'pytorch')
    if sharding == 'fsdp2':
        from mmnanguard.testing.fsdp2 import register, skip_reinit

        cfg.model_wrapper_cfg = dict(type=register())
    runner = RUNNERS.build(cfg) if 'runner_type' in cfg else None
    if runner is None:
        from mmengine.runner import Runner

        runner = Runner.from_cfg(cfg)
    if sharding == 'fsdp2':
        skip_reinit(runner)
    stamps: List[float] = []
    sequence: List[int] = []
    group = torch_dist.distributed_c10d._get_default_group()

    class Clock(Hook):
        priority = 'LOWEST'

        def after_train_iter(self, runner, *args, **kwargs) -> None:
            stamps.append(time.perf_counter())
            # every collective of the group, also those a DTensor issues
            # inside its own dispatch (which a TorchDispatchMode cannot see)
            sequence.append(group._get_sequence_number_for_group())

    runner.register_hook(Clock())
    with count_host_syncs() as counts:
        runner.train()
    steps = [b - a for a, b in zip(stamps[SKIP:], stamps[SKIP + 1 :])]
    result = counts.per_iteration(skip=SKIP)
    result['s_per_iter'] = statistics.median(steps)
    deltas = [b - a for a, b in zip(sequence[SKIP:], sequence[SKIP + 1 :])]
    result['group_collectives_each'] = deltas
    result['group_collectives'] = statistics.median(deltas)
    rank = torch_dist.get_rank()
    with open(f'{out}.rank{rank}', 'w') as f:
        json.dump(result, f)
    close_process_group(completed=True)
    return 0


def run_one(
    data_root: str, sharding: str, guard: str, clip: str, tmp: str
) -> Dict[str, Any]:
    """One 2-process run; rank 0's counts and its median s/iter."""
    from mmnanguard.testing.distributed import free_port, torchrun_args

    work_dir = tempfile.mkdtemp(dir=tmp)
    out = osp.join(work_dir, 'counts.json')
    env = dict(os.environ, PYTHONWARNINGS='ignore', OMP_NUM_THREADS='1')
    for _ in range(2):  # a port taken between free_port() and torchrun
        cmd = (
            [sys.executable]
            + torchrun_args(PROCS, free_port())
            + [__file__, '--worker', out, data_root, sharding, guard, clip]
        )
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if 'EADDRINUSE' not in proc.stderr and (
            'address already in use' not in proc.stderr.lower()
        ):
            break
    if proc.returncode != 0:
        raise RuntimeError(
            f'{sharding}/{guard}/{clip} failed:\n{proc.stderr[-4000:]}'
        )
    ranks = []
    for rank in range(PROCS):
        with open(f'{out}.rank{rank}') as f:
            ranks.append(json.load(f))
    result = ranks[0]
    result['ranks_agree'] = all(
        r['collectives_each'] == result['collectives_each'] for r in ranks
    )
    return result


def summarize(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Collectives and reads added by the guard and the overhead ratio,
    per ``sharding/clip``."""
    table: Dict[str, Any] = {}
    keys = sorted({(r['sharding'], r['clip']) for r in runs})
    for sharding, clip in keys:
        on = [
            r
            for r in runs
            if (r['sharding'], r['clip'], r['guard'])
            == (sharding, clip, 'skip')
        ]
        off = [
            r
            for r in runs
            if (r['sharding'], r['clip'], r['guard'])
            == (sharding, clip, 'off')
        ]
        ratios = [a['s_per_iter'] / b['s_per_iter'] for a, b in zip(on, off)]
        table[f'{sharding}/{clip}'] = dict(
            collectives_added=on[0]['collectives'] - off[0]['collectives'],
            group_collectives_added=on[0]['group_collectives']
            - off[0]['group_collectives'],
            reads_added=on[0]['reads'] - off[0]['reads'],
            guard_collective_sites=on[0]['collective_sites'],
            bare_collective_sites=off[0]['collective_sites'],
            ranks_agree=all(r['ranks_agree'] for r in on + off),
            ratio_median=round(statistics.median(ratios), 3),
            ratio_min=round(min(ratios), 3),
            ratio_max=round(max(ratios), 3),
            s_per_iter_on=[round(r['s_per_iter'], 3) for r in on],
            s_per_iter_off=[round(r['s_per_iter'], 3) for r in off],
        )
    return table


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ['--worker']:
        return _worker(*argv[1:])
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument('--pairs', type=int, default=3)
    parser.add_argument('--sharding', nargs='+', default=['ddp', 'fsdp2'])
    parser.add_argument('--clip', nargs='+', default=['clip', 'noclip'])
    parser.add_argument('--out', default=None)
    args = parser.parse_args(argv)
    from mmnanguard.datagen import generate_coco

    runs: List[Dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        data_root = osp.join(tmp, 'coco')
        generate_coco(data_root, num_images=8, seed=0)
        for pair in range(args.pairs):
            for sharding in args.sharding:
                for clip in args.clip:
                    order = (
                        ['off', 'skip'] if pair % 2 == 0 else ['skip', 'off']
                    )
                    for guard in order:
                        result = run_one(data_root, sharding, guard, clip, tmp)
                        result.update(
                            sharding=sharding,
                            guard=guard,
                            clip=clip,
                            pair=pair,
                        )
                        runs.append(result)
                        print(
                            f'{sharding}/{clip}/{guard} pair {pair}: '
                            f"{result['s_per_iter']:.3f} s/iter, "
                            f"{result['collectives']:.0f} collectives/iter "
                            f"({result['group_collectives']:.0f} in the "
                            'group)',
                            flush=True,
                        )
    table = summarize(runs)
    print(json.dumps(table, indent=1))
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(dict(summary=table, runs=runs), f, indent=1)
    return 0


if __name__ == '__main__':
    sys.exit(main())
