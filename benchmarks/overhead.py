# Copyright (c) mmnanguard contributors. All rights reserved.
"""Overhead of the guard against bare training, measured in one run.

Each (round, config, mode) trains a fresh runner in its own subprocess, so
that every mode has the same process layout and its own peak RSS. Modes are
interleaved within each round (the order rotates from round to round), and
the ratio to ``bare`` is computed per round, from the median s/iter of the
measured iterations (after ``--warmup``), so that drifts of a noisy machine
cancel out. The report gives the median ratio with its min and max over the
rounds, the median s/iter and the peak RSS per mode.

Usage::

    python benchmarks/overhead.py --rounds 5 --iters 16 --warmup 6 \
        --configs dota coco --modes bare guard_skip --out overhead.json
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

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, REPO)

#: mode -> what it adds to the tiny config
MODES = {
    'bare': 'plain mmengine training',
    'check_invalid_loss': "mmdet's CheckInvalidLossHook(interval=1)",
    'guard_skip': 'NanGuardHook(policy=skip), every-iteration checks',
    'guard_full': 'NanGuardHook + AmpScaleMonitorHook + ValidateAnnotations',
    'anomaly': 'torch.autograd.set_detect_anomaly(True)',
    'module_hooks': 'forward + output-gradient finiteness hooks on every '
    'module, always on',
}


def worker(
    config: str, mode: str, iters: int, data_root: str, work_dir: str
) -> dict:
    """Train ``iters`` iterations in this process and return the timings."""
    import resource

    import torch
    from mmengine.runner import Runner

    import mmnanguard  # noqa: F401
    from mmnanguard.testing import (
        TINY_COCO_CONFIG,
        TINY_DOTA_CONFIG,
        load_tiny_config,
    )
    from mmnanguard.testing.module_hooks import install_finiteness_hooks

    path = dict(dota=TINY_DOTA_CONFIG, coco=TINY_COCO_CONFIG)[config]
    hooks = []
    if mode == 'check_invalid_loss':
        hooks.append(dict(type='mmdet.CheckInvalidLossHook', interval=1))
    if mode in ('guard_skip', 'guard_full'):
        hooks.append(dict(type='NanGuardHook', policy='skip'))
    cfg = load_tiny_config(
        path, work_dir, data_root, max_iters=iters, custom_hooks=hooks
    )
    cfg.default_hooks.checkpoint = None
    cfg.default_hooks.logger.interval = 1000
    if mode == 'guard_full':
        from mmnanguard.testing.full_protection import add_full_protection

        add_full_protection(cfg)
    if mode == 'anomaly':
        torch.autograd.set_detect_anomaly(True)
    runner = Runner.from_cfg(cfg)
    if mode == 'module_hooks':
        install_finiteness_hooks(runner.model)
    runner.train()
    times = runner.message_hub.get_scalar('train/time').data[0].tolist()
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return dict(times=times, peak_rss_mib=peak_kib / 1024)


def run_one(config, mode, args, data_roots) -> dict:
    with tempfile.TemporaryDirectory() as work_dir:
        out = osp.join(work_dir, 'result.json')
        cmd = [
            sys.executable,
            __file__,
            '--worker',
            config,
            mode,
            str(args.iters),
            data_roots[config],
            work_dir,
            out,
        ]
        env = dict(os.environ, PYTHONWARNINGS='ignore')
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise RuntimeError(
                f'{config}/{mode} failed:\n{proc.stderr[-3000:]}'
            )
        with open(out) as f:
            return json.load(f)


def summarize(results, modes, configs, warmup) -> dict:
    summary = {}
    for config in configs:
        summary[config] = {}
        per_round = results[config]
        for mode in modes:
            medians = [
                statistics.median(r[mode]['times'][warmup:]) for r in per_round
            ]
            ratios = [
                statistics.median(r[mode]['times'][warmup:])
                / statistics.median(r['bare']['times'][warmup:])
                for r in per_round
            ]
            summary[config][mode] = dict(
                s_per_iter=statistics.median(medians),
                ratio=statistics.median(ratios),
                ratio_min=min(ratios),
                ratio_max=max(ratios),
                measured_iters=sum(
                    len(r[mode]['times'][warmup:]) for r in per_round
                ),
                peak_rss_mib=max(r[mode]['peak_rss_mib'] for r in per_round),
            )
    return summary


def print_table(summary) -> None:
    print(
        f"{'config':<6} {'mode':<20} {'s/iter':>8} {'ratio':>7} "
        f"{'min':>7} {'max':>7} {'iters':>6} {'peak RSS MiB':>13}"
    )
    for config, rows in summary.items():
        for mode, row in rows.items():
            print(
                f"{config:<6} {mode:<20} {row['s_per_iter']:>8.4f} "
                f"{row['ratio']:>7.3f} {row['ratio_min']:>7.3f} "
                f"{row['ratio_max']:>7.3f} {row['measured_iters']:>6d} "
                f"{row['peak_rss_mib']:>13.0f}"
            )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument('--rounds', type=int, default=5)
    parser.add_argument('--iters', type=int, default=16)
    parser.add_argument('--warmup', type=int, default=6)
    parser.add_argument(
        '--configs',
        nargs='+',
        default=['dota', 'coco'],
        choices=['dota', 'coco'],
    )
    parser.add_argument(
        '--modes',
        nargs='+',
        default=['bare', 'guard_skip'],
        choices=list(MODES),
    )
    parser.add_argument('--out', help='write the raw results and summary')
    parser.add_argument('--worker', nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        config, mode, iters, data_root, work_dir, out = args.worker
        result = worker(config, mode, int(iters), data_root, work_dir)
        with open(out, 'w') as f:
            json.dump(result, f)
        return 0
    if args.warmup >= args.iters:
        parser.error(f'--warmup {args.warmup} must be < --iters {args.iters}')
    modes = ['bare'] + [m for m in args.modes if m != 'bare']
    from mmnanguard.datagen import generate_coco, generate_dota

    data_dir = tempfile.mkdtemp(prefix='nanguard_bench_')
    data_roots = dict(
        dota=osp.join(data_dir, 'dota'), coco=osp.join(data_dir, 'coco')
    )
    generate_dota(data_roots['dota'], num_images=8, seed=0)
    generate_coco(data_roots['coco'], num_images=8, seed=0)
    results = {c: [] for c in args.configs}
    start = time.time()
    for round_idx in range(args.rounds):
        order = (
            modes[round_idx % len(modes) :] + modes[: round_idx % len(modes)]
        )
        for config in args.configs:
            results[config].append(
                {m: run_one(config, m, args, data_roots) for m in order}
            )
        print(
            f'round {round_idx + 1}/{args.rounds} done '
            f'({time.time() - start:.0f} s)',
            flush=True,
        )
    summary = summarize(results, modes, args.configs, args.warmup)
    print_table(summary)
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(
                dict(summary=summary, raw=results, args=vars(args)),
                f,
                indent=1,
            )
    return 0


if __name__ == '__main__':
    sys.exit(main())
