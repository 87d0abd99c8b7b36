# Copyright (c) mmnanguard contributors. All rights reserved.
"""Overhead of the guard against bare training, measured in one run.

Each (round, config, mode) trains a fresh runner in its own subprocess, so
that every mode has the same process layout and its own peak RSS. Modes are
interleaved within each round (the order rotates from round to round), and
the ratio to ``bare`` is computed per round, from the median s/iter of the
measured iterations (after ``--warmup``), so that drifts of a noisy machine
cancel out. Round ``i`` trains every mode with ``randomness.seed=i``: the
protected run seeds each batch's augmentations itself (for an exact
resume), so with one seed the two modes would see other random flips in
every round, and the cost of data-dependent ops (the rotated-box IoU of
the assigner) would differ between them the same way each time; over
rounds of different seeds that difference averages out. The report gives
the median ratio with its min and max over the rounds, the median s/iter
and the peak RSS per mode.

``include`` is what ``tools/train.py --guard skip`` trains (the
``NanGuardRunner`` with the include's defaults: spike detection,
``NanDiagnosisHook``, ``ValidateAnnotations`` in the training pipeline);
``bare`` is what ``--guard off`` trains. The tiny configs load with
``num_workers=0`` (``--num-workers`` changes it), so the pipeline, and
``ValidateAnnotations`` in it, runs in the main process and is timed.

``--profile`` adds one cProfile'd run of each profiled mode (``include``
by default) after the rounds, and attributes the guard's time per
iteration to its components (:data:`COMPONENTS`: the input check, the
loss and gradient-norm checks, the spike detector, the parameter check,
the history, ``ValidateAnnotations``, the host reads of the guard's own
code, ...). cProfile inflates Python-heavy code more than torch kernels,
so the shares are upper bounds.

``--sample`` adds ``--sample-rounds`` interleaved runs of each sampled mode
under :class:`stack_sampler.StackSampler`, a sampling profiler of whole
iterations that leaves the code unchanged, and prints where the time per
iteration differs: by stage of the iteration (data loading, hooks,
forward, backward, step) and by function.

Usage::

    python benchmarks/overhead.py --rounds 5 --iters 16 --warmup 6 \
        --configs dota coco --modes bare guard_skip --out overhead.json
    # the num_workers=0 row of RESULTS.md, with the profile
    python benchmarks/overhead.py --rounds 3 --iters 32 --warmup 4 \
        --configs dota --modes bare include --profile
    # the whole-iteration comparison of docs/benchmarks.md
    python benchmarks/overhead.py --rounds 9 --iters 24 --warmup 4 \
        --images 32 --configs dota coco --modes bare include --sample \
        --out benchmarks/overhead_sampled.json
"""

import argparse
import cProfile
import json
import os
import os.path as osp
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

from mmengine.hooks import Hook

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, REPO)

#: mode -> what it adds to the tiny config
MODES = {
    'bare': 'plain mmengine training',
    'check_invalid_loss': "mmdet's CheckInvalidLossHook(interval=1)",
    'guard_skip': 'NanGuardHook(policy=skip), every-iteration checks',
    'guard_full': 'NanGuardHook + AmpScaleMonitorHook + ValidateAnnotations',
    'include': 'tools/train.py --guard skip: the include, num_workers=0',
    'anomaly': 'torch.autograd.set_detect_anomaly(True)',
    'module_hooks': 'forward + output-gradient finiteness hooks on every '
    'module, always on',
}


def worker(
    config: str,
    mode: str,
    iters: int,
    data_root: str,
    work_dir: str,
    num_workers: Optional[int] = None,
    profile: Optional[str] = None,
    sample: Optional[Tuple[str, int]] = None,
    seed: int = 0,
) -> dict:
    """Train ``iters`` iterations in this process and return the timings.

    Args:
        config (str): ``'dota'`` or ``'coco'``.
        mode (str): A key of :data:`MODES`.
        iters (int): Training iterations.
        data_root (str): Generated data.
        work_dir (str): The run's work dir.
        num_workers (int, optional): Dataloader workers (default: the
            config's, 0).
        profile (str, optional): Write cProfile stats of ``runner.train()``
            to this file.
        sample (tuple, optional): ``(path, warmup)``: sample the stack of
            the iterations after ``warmup`` (:class:`StackSampler`) and
            write the samples to ``path``.
        seed (int): The run's ``randomness.seed`` (the round's).

    Returns:
        dict: ``times`` (s per iteration) and ``peak_rss_mib``.
    """
    import resource

    import torch
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner
    from module_hooks import install_finiteness_hooks

    import mmnanguard  # noqa: F401
    from mmnanguard.testing import (
        TINY_COCO_CONFIG,
        TINY_DOTA_CONFIG,
        load_tiny_config,
    )

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
    cfg.randomness = dict(seed=seed)
    if mode == 'guard_full':
        from full_protection import add_full_protection

        add_full_protection(cfg)
    if mode == 'anomaly':
        torch.autograd.set_detect_anomaly(True)
    if num_workers is not None:
        cfg.train_dataloader.num_workers = num_workers
        cfg.train_dataloader.persistent_workers = num_workers > 0
    if mode in ('bare', 'include'):  # as tools/train.py --guard off|skip
        from mmnanguard.engine.runner import train_options as opts

        opts.apply_guard_option(cfg, 'skip' if mode == 'include' else 'off')
    if 'runner_type' in cfg:
        runner = RUNNERS.build(cfg)
    else:
        runner = Runner.from_cfg(cfg)
    if mode == 'module_hooks':
        install_finiteness_hooks(runner.model)
    if sample:
        from stack_sampler import StackSampler

        sampler = StackSampler()
        runner.register_hook(
            SamplingWindow(sampler, sample[1]), priority='LOWEST'
        )
    if profile:
        profiler = cProfile.Profile()
        profiler.runcall(runner.train)
        profiler.dump_stats(profile)
    else:
        runner.train()
    times = runner.message_hub.get_scalar('train/time').data[0].tolist()
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if sample:
        with open(sample[0], 'w') as f:
            json.dump(sampler.as_dict(), f)
    return dict(times=times, peak_rss_mib=peak_kib / 1024)


class SamplingWindow(Hook):
    """Samples whole iterations, ``warmup`` to the last.

    The sampler starts at the end of iteration ``warmup - 1`` and stops at
    the end of the last one (as the last hook of each), so the window holds
    each sampled iteration's data loading, hooks and step exactly once.

    Args:
        sampler (StackSampler): The sampler to start and stop.
        warmup (int): Iterations left out.
    """

    def __init__(self, sampler, warmup: int) -> None:
        self.sampler = sampler
        self.warmup = warmup

    def after_train_iter(
        self, runner, batch_idx, data_batch=None, outputs=None
    ) -> None:
        if runner.iter + 1 == self.warmup:
            self.sampler.start()
        elif runner.iter + 1 == runner.max_iters:
            self.sampler.stop()


def run_one(
    config, mode, args, data_roots, profile=None, sample=None, seed=0
) -> dict:
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
        if args.num_workers is not None:
            cmd += ['--num-workers', str(args.num_workers)]
        if profile:
            cmd += ['--profile-out', profile]
        if sample:
            cmd += ['--sample-out', sample, '--warmup', str(args.warmup)]
        cmd += ['--seed', str(seed)]
        env = dict(os.environ, PYTHONWARNINGS='ignore')
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise RuntimeError(
                f'{config}/{mode} failed:\n{proc.stderr[-3000:]}'
            )
        with open(out) as f:
            return json.load(f)


#: Guard component -> the functions whose cumulative time is its cost, as
#: ``(path suffix, function name)``; ``minus`` entries are subtracted
#: (time of nested components, or of the model work a wrapper calls).
COMPONENTS: Dict[str, Dict[str, List[Tuple[str, str]]]] = {
    'input check (finite flag of the batch)': dict(
        plus=[
            ('engine/guard/input_check.py', 'finite_flag'),
            ('engine/guard/input_check.py', 'batch_tensors'),
        ]
    ),
    'loss flag of each micro-batch (before backward, no read)': dict(
        plus=[('engine/guard/step_guard.py', 'note_loss')]
    ),
    "the step's one read (gradient norms, verdict vector, spike check)": dict(
        plus=[('engine/guard/step_guard.py', 'read')],
    ),
    'spike detector (device-side running max)': dict(
        plus=[('engine/guard/spike_detector.py', 'check')]
    ),
    'parameter and buffer check after the step (queued, no read)': dict(
        plus=[('engine/guard/params_check.py', 'queue')]
    ),
    'the guarded step besides the read (clip and optimizer step, which '
    'bare training runs too)': dict(
        plus=[('engine/optimizers/guarded_optim_wrapper.py', 'step')],
        minus=[
            ('engine/guard/step_guard.py', 'read'),
            ('engine/guard/params_check.py', 'queue'),
        ],
    ),
    'history (append, scheduled lr, live lrs) and the lr backoff check': dict(
        plus=[
            ('engine/guard/history.py', 'append'),
            ('engine/guard/scheduled_lr.py', 'read_groups'),
            ('engine/guard/lr_backoff.py', 'live_lrs'),
            ('engine/guard/recovery.py', 'enforce_backoff'),
        ]
    ),
    'RNG state for the incident batch': dict(
        plus=[('engine/guard/rng.py', 'capture_rng_state')]
    ),
    'counters to the MessageHub': dict(
        plus=[('engine/guard/responder.py', 'publish')]
    ),
    'snapshots (every snapshot_interval iterations)': dict(
        plus=[('engine/guard/recovery.py', 'take_snapshot')]
    ),
    'ValidateAnnotations (main-process pipeline)': dict(
        plus=[('datasets/transforms/validate_annotations.py', 'transform')]
    ),
    'NanGuardHook before/after_train_iter (all of the above in hooks)': dict(
        plus=[
            ('engine/hooks/nanguard_hook.py', 'before_train_iter'),
            ('engine/hooks/nanguard_hook.py', 'after_train_iter'),
        ]
    ),
    'other mmnanguard hooks per iteration (AMP monitor, diagnosis)': dict(
        plus=[
            ('engine/hooks/amp_scale_monitor_hook.py', 'before_train_iter'),
            ('engine/hooks/amp_scale_monitor_hook.py', 'after_train_iter'),
            ('engine/hooks/nan_diagnosis_hook.py', 'before_train_iter'),
            ('engine/hooks/nan_diagnosis_hook.py', 'after_train_iter'),
        ]
    ),
}
#: Host reads the guard makes itself: these C methods, called from
#: mmnanguard code (``float(t)``/``bool(t)`` go through type slots that
#: cProfile does not see; on the CPU each read costs microseconds).
HOST_READ_METHODS = ('item', 'tolist', 'numpy', 'cpu')


def _cumtime(stats, suffix: str, name: str) -> float:
    return sum(
        value[3]
        for (path, _, func), value in stats.stats.items()
        if func == name and path.replace(os.sep, '/').endswith(suffix)
    )


def profile_components(
    path: str, iters: int, s_per_iter: float, profiled_s_per_iter: float
) -> dict:
    """Guard time per component from a cProfile dump of ``iters``
    iterations.

    Args:
        path (str): The dump (``runner.train()`` of one run).
        iters (int): Iterations of the run.
        s_per_iter (float): Median s/iter of the mode without the profiler
            (the denominator of the shares).
        profiled_s_per_iter (float): Median s/iter of the profiled run.

    Returns:
        dict: component -> ``ms_per_iter`` (under cProfile: an upper bound
        of the real time) and ``share`` of an unprofiled iteration, plus
        ``s_per_iter`` and ``profiled_s_per_iter``.
    """
    import pstats

    stats = pstats.Stats(path)
    rows: Dict[str, Any] = {}
    for component, spec in COMPONENTS.items():
        total = sum(_cumtime(stats, *f) for f in spec.get('plus', []))
        total -= sum(_cumtime(stats, *f) for f in spec.get('minus', []))
        rows[component] = max(total, 0.0)
    reads = 0.0
    for (_, _, func), value in stats.stats.items():
        method = func.split("'")[1] if func.startswith('<method') else ''
        if method not in HOST_READ_METHODS:
            continue
        for (caller, _, _), c_value in value[4].items():
            if 'mmnanguard' in caller.replace(os.sep, '/'):
                reads += c_value[3]
    rows['host reads in mmnanguard code (.item/.tolist/...)'] = reads
    return dict(
        s_per_iter=s_per_iter,
        profiled_s_per_iter=profiled_s_per_iter,
        components={
            k: dict(
                ms_per_iter=1000 * v / iters,
                share=v / iters / s_per_iter if s_per_iter else None,
            )
            for k, v in rows.items()
        },
    )


def print_profiles(profiles: dict) -> None:
    for run, profile in profiles.items():
        print(
            f"\nprofile {run} (median {profile['s_per_iter']:.3f} s/iter, "
            f"{profile['profiled_s_per_iter']:.3f} under cProfile)"
        )
        print('| component | ms/iter (cProfile) | share of an iteration |')
        print('|---|---|---|')
        for name, row in profile['components'].items():
            print(
                f"| {name} | {row['ms_per_iter']:.2f} "
                f"| {100 * (row['share'] or 0):.2f} % |"
            )


def interleaved(modes: List[str], round_idx: int) -> List[str]:
    """The order of ``modes`` in round ``round_idx``: rotated by one each
    round, so that no mode always runs first on a drifting machine."""
    shift = round_idx % len(modes)
    return modes[shift:] + modes[:shift]


def sample_modes(config, modes, args, data_roots, data_dir) -> dict:
    """Sampled runs of ``modes``, interleaved, and their time per iteration
    by function.

    Args:
        config (str): ``'dota'`` or ``'coco'``.
        modes (list[str]): The modes; the first is the baseline.
        args (argparse.Namespace): ``iters``, ``warmup``, ``sample_rounds``.
        data_roots (dict): config -> generated data.
        data_dir (str): Where the sample files go.

    Returns:
        dict: ``mode -> {'ms_per_iter', 'inclusive', 'self'}``, each the
        median over the sampled runs, in ms per iteration (a function
        absent from a run counts 0 there).
    """
    iters = args.iters - args.warmup
    runs: Dict[str, List[dict]] = {m: [] for m in modes}
    for round_idx in range(args.sample_rounds):
        for mode in interleaved(modes, round_idx):
            path = osp.join(data_dir, f'{config}_{mode}_{round_idx}.json')
            run_one(
                config, mode, args, data_roots, sample=path, seed=round_idx
            )
            with open(path) as f:
                runs[mode].append(json.load(f))

    def median_ms(values: List[dict], field: str) -> Dict[str, float]:
        keys = set().union(*(v[field] for v in values))
        return {
            k: 1000
            * statistics.median(v[field].get(k, 0.0) for v in values)
            / iters
            for k in keys
        }

    return {
        mode: dict(
            ms_per_iter=1000
            * statistics.median(r['sampled_s'] for r in runs[mode])
            / iters,
            inclusive=median_ms(runs[mode], 'inclusive'),
            self=median_ms(runs[mode], 'self_time'),
        )
        for mode in modes
    }


#: The stages of an mmengine iteration: stage -> the functions that are
#: it, the outermost first (a mode that overrides one is matched by its
#: own file; the largest inclusive time of the alternatives counts).
STAGES = {
    'data loading (pipeline, collate)': [
        'mmengine/runner/loops.py:__next__',
        'mmnanguard/engine/resume/resume_position.py:__next__',
    ],
    'before_train_iter hooks': [],
    'data_preprocessor': [
        'mmengine/model/base_model/data_preprocessor.py:forward',
        'mmdet/models/data_preprocessors/data_preprocessor.py:forward',
    ],
    'forward and losses': [
        'mmengine/model/base_model/base_model.py:_run_forward'
    ],
    'parse_losses': ['mmengine/model/base_model/base_model.py:parse_losses'],
    'backward': [
        'mmengine/optim/optimizer/optimizer_wrapper.py:backward',
        'mmnanguard/engine/optimizers/guarded_optim_wrapper.py:backward',
    ],
    'step (clip, read, optimizer)': [
        'mmengine/optim/optimizer/optimizer_wrapper.py:step',
        'mmnanguard/engine/optimizers/guarded_optim_wrapper.py:step',
    ],
    'zero_grad': ['mmengine/optim/optimizer/optimizer_wrapper.py:zero_grad'],
    'after_train_iter hooks': [],
    'the whole iteration (sampled)': [],
}


def stage_times(sampled: dict) -> Dict[str, float]:
    """ms per iteration of each stage of :data:`STAGES`.

    Hook stages are the ``call_hook`` time split by the hooks' own
    functions; the whole iteration is the sampled time.
    """
    inclusive = sampled['inclusive']
    rows = {
        stage: max((inclusive.get(k, 0.0) for k in keys), default=0.0)
        for stage, keys in STAGES.items()
    }
    for stage, name in (
        ('before_train_iter hooks', 'before_train_iter'),
        ('after_train_iter hooks', 'after_train_iter'),
    ):
        rows[stage] = sum(
            v
            for k, v in inclusive.items()
            if k.endswith(f':{name}') and 'overhead.py' not in k
        )
    rows['the whole iteration (sampled)'] = sampled['ms_per_iter']
    return rows


def print_samples(config: str, samples: dict, top: int = 25) -> None:
    """The stage table and the functions whose inclusive time differs most,
    each mode against the first."""
    modes = list(samples)
    base = modes[0]
    stages = {m: stage_times(samples[m]) for m in modes}
    print(f'\nsampled {config}: ms per iteration, median of the runs')
    print('| stage | ' + ' | '.join(modes) + ' | difference |')
    print('|---' * (len(modes) + 2) + '|')
    for stage in STAGES:
        cells = ' | '.join(f'{stages[m][stage]:.1f}' for m in modes)
        diff = stages[modes[-1]][stage] - stages[base][stage]
        print(f'| {stage} | {cells} | {diff:+.1f} |')
    for mode in modes[1:]:
        a, b = samples[base]['inclusive'], samples[mode]['inclusive']
        diffs = sorted(
            ((b.get(k, 0.0) - a.get(k, 0.0), k) for k in set(a) | set(b)),
            key=lambda d: -abs(d[0]),
        )[:top]
        print(f'\nfunctions, {mode} - {base}, inclusive ms per iteration')
        for diff, key in diffs:
            print(
                f'{diff:+8.2f}  {a.get(key, 0.0):8.2f} -> '
                f'{b.get(key, 0.0):8.2f}  {key}'
            )


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
    parser.add_argument(
        '--num-workers',
        type=int,
        help="dataloader workers (default: the tiny configs' 0)",
    )
    parser.add_argument(
        '--profile',
        nargs='*',
        metavar='MODE',
        help='after the rounds, one cProfile run per MODE (default: '
        'include) and the guard time per component',
    )
    parser.add_argument(
        '--sample',
        nargs='*',
        metavar='MODE',
        help='after the rounds, --sample-rounds interleaved runs per MODE '
        '(default: bare include) under a sampling profiler of whole '
        'iterations, and where their time per iteration differs',
    )
    parser.add_argument('--sample-rounds', type=int, default=3)
    parser.add_argument(
        '--images',
        type=int,
        default=8,
        help='generated images per dataset (an epoch is images / 2 '
        'iterations; mmengine pauses 2 s at the end of each)',
    )
    parser.add_argument('--out', help='write the raw results and summary')
    parser.add_argument('--worker', nargs=6, help=argparse.SUPPRESS)
    parser.add_argument('--profile-out', help=argparse.SUPPRESS)
    parser.add_argument('--sample-out', help=argparse.SUPPRESS)
    parser.add_argument('--seed', type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        config, mode, iters, data_root, work_dir, out = args.worker
        result = worker(
            config,
            mode,
            int(iters),
            data_root,
            work_dir,
            num_workers=args.num_workers,
            profile=args.profile_out,
            sample=(args.sample_out, args.warmup) if args.sample_out else None,
            seed=args.seed,
        )
        with open(out, 'w') as f:
            json.dump(result, f)
        return 0
    if args.warmup >= args.iters:
        parser.error(f'--warmup {args.warmup} must be < --iters {args.iters}')
    if args.sample is not None and args.warmup < 1:
        # the window opens at the end of iteration warmup - 1
        parser.error(f'--sample needs --warmup >= 1, got {args.warmup}')
    modes = ['bare'] + [m for m in args.modes if m != 'bare']
    from mmnanguard.datagen import generate_coco, generate_dota

    data_dir = tempfile.mkdtemp(prefix='nanguard_bench_')
    data_roots = dict(
        dota=osp.join(data_dir, 'dota'), coco=osp.join(data_dir, 'coco')
    )
    generate_dota(data_roots['dota'], num_images=args.images, seed=0)
    generate_coco(data_roots['coco'], num_images=args.images, seed=0)
    results = {c: [] for c in args.configs}
    start = time.time()
    for round_idx in range(args.rounds):
        order = interleaved(modes, round_idx)
        for config in args.configs:
            results[config].append(
                {
                    m: run_one(config, m, args, data_roots, seed=round_idx)
                    for m in order
                }
            )
        print(
            f'round {round_idx + 1}/{args.rounds} done '
            f'({time.time() - start:.0f} s)',
            flush=True,
        )
    summary = {}
    if args.rounds:
        summary = summarize(results, modes, args.configs, args.warmup)
        print_table(summary)
    profiles = {}
    if args.profile is not None:
        for config in args.configs:
            for mode in args.profile or ['include']:
                stats = osp.join(data_dir, f'{config}_{mode}.prof')
                timed = run_one(config, mode, args, data_roots, stats)
                profiled = statistics.median(timed['times'][args.warmup :])
                # the share is of an unprofiled iteration where measured
                row = summary[config].get(mode, {})
                profiles[f'{config}/{mode}'] = profile_components(
                    stats,
                    args.iters,
                    row.get('s_per_iter', profiled),
                    profiled,
                )
        print_profiles(profiles)
    samples = {}
    if args.sample is not None:
        sampled = args.sample or ['bare', 'include']
        for config in args.configs:
            samples[config] = sample_modes(
                config, sampled, args, data_roots, data_dir
            )
            print_samples(config, samples[config])
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(
                dict(
                    summary=summary,
                    raw=results,
                    profiles=profiles,
                    samples=samples,
                    args=vars(args),
                ),
                f,
                indent=1,
            )
    shutil.rmtree(data_dir, ignore_errors=True)  # data and profile dumps
    return 0


if __name__ == '__main__':
    sys.exit(main())
