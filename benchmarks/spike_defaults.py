# Copyright (c) mmnanguard contributors. All rights reserved.
"""What a default ``spike.action='skip'`` (and a snapshot cadence tied to
the spike detector's warmup) would do: damaging steps avoided against
false skips.

Each case is an upstream config loaded with
``mmnanguard::_base_/nanguard.py`` (as a user writes it), shrunk like a
zoo cell (``zoo_cell.build_cell_config``: ResNet-18 or the config's own
backbone without pretrained weights, BN for SyncBN, batch 2, generated
data, no validation) with images scaled to ``--img-side`` pixels, and
trained for a fixed number of iterations under three settings of the
include:

* ``A``: the include as shipped (``spike.action='log'``,
  ``snapshot_interval=50``);
* ``B``: ``spike.action='skip'``;
* ``C``: ``B`` and ``snapshot_interval`` = the detector's ``warmup``;
* ``D``: ``B`` without the lr backoff of each skipped spike
  (``spike.backoff=False``; a rollback still backs off);
* ``E``: ``A`` with ``snapshot_interval`` = ``warmup`` (the cadence
  alone);
* ``F``: ``B`` with ``spike.factor=5``.

The cases: the two user-reported lr explosions for a batch of 2 (Faster
R-CNN at lr 0.8, RetinaNet at lr 1.0, ``policy='rollback'``), and clean
runs at the config's own lr (the two detectors, the zoo subset of
``tests/test_benchmarks/test_zoo_subset.py``; the include's own policy).

Only the schedulers that the upstream config steps per iteration are
kept: the epoch-based ones (MultiStepLR at epochs 8 and 11, a cosine
from epoch 150) act far beyond the iterations trained here, and
``shrink_runtime`` would otherwise turn their epochs into iterations.
What a user sees in the first hundred iterations is the warmup.

Per iteration a hook records the live lr, the loss, the grad norm, the
detector's flags, whether the step was taken, and the guard's counters.
A step is *damaging* when it was taken while the detector's rule flags
it: a loss quantity or the grad norm above ``factor`` times the running
max of the last ``window`` admitted values, once ``warmup`` values were
admitted (``SpikeDetector``). The rule is replayed here in float64 on
the recorded series (:func:`replay_rule`), independently of the online
detector; both are reported with their agreement. A *false skip* is a
step dropped by the guard on a clean run.

Usage::

    python benchmarks/spike_defaults.py run \\
        --out benchmarks/spike_defaults.json
    python benchmarks/spike_defaults.py run --cases faster_rcnn_lr0.8 \\
        --settings A --out /tmp/x.json
    python benchmarks/spike_defaults.py markdown benchmarks/spike_defaults.json

Each (case, setting) runs in its own interpreter with one torch thread
and a timeout (``cell``); the JSON is rewritten after each.
"""

import argparse
import hashlib
import json
import math
import os
import os.path as osp
import platform
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

HERE = osp.dirname(osp.abspath(__file__))
REPO = osp.dirname(HERE)
sys.path[:0] = [HERE, REPO]

#: name -> upstream config, lr (None: the config's), iterations, kind.
CASES: Dict[str, Dict[str, Any]] = {
    'faster_rcnn_lr0.8': dict(
        config='mmdet::faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py',
        lr=0.8,
        iters=100,
        kind='explosion',
    ),
    'retinanet_lr1.0': dict(
        config='mmdet::retinanet/retinanet_r50_fpn_1x_coco.py',
        lr=1.0,
        iters=100,
        kind='explosion',
    ),
    'faster_rcnn': dict(
        config='mmdet::faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py',
        lr=None,
        iters=60,
        kind='clean',
    ),
    'retinanet': dict(
        config='mmdet::retinanet/retinanet_r50_fpn_1x_coco.py',
        lr=None,
        iters=60,
        kind='clean',
    ),
    'mask_rcnn': dict(
        config='mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py',
        lr=None,
        iters=60,
        kind='clean',
    ),
    'rtmdet_tiny': dict(
        config='mmdet::rtmdet/rtmdet_tiny_8xb32-300e_coco.py',
        lr=None,
        iters=60,
        kind='clean',
    ),
    's2anet': dict(
        config='mmrotate::s2anet/s2anet-le90_r50_fpn_1x_dota.py',
        lr=None,
        iters=60,
        kind='clean',
    ),
    'ocrnet': dict(
        config='mmseg::ocrnet/ocrnet_hr18_4xb2-80k_cityscapes-512x1024.py',
        lr=None,
        iters=60,
        kind='clean',
    ),
}

#: The detector's own defaults (``SpikeSettings``), which the include
#: does not override beyond ``action``, ``factor`` and ``window``.
WARMUP = 10
SETTINGS: Dict[str, Dict[str, Any]] = {
    'A': dict(),
    'B': dict(spike=dict(action='skip')),
    'C': dict(spike=dict(action='skip'), snapshot_interval=WARMUP),
    'D': dict(spike=dict(action='skip', backoff=False)),
    'E': dict(snapshot_interval=WARMUP),
    'F': dict(spike=dict(action='skip', factor=5.0)),
}
SETTING_NAMES = {
    'A': "include as shipped (spike.action='log', snapshot_interval=50)",
    'B': "spike.action='skip'",
    'C': f"spike.action='skip', snapshot_interval={WARMUP}",
    'D': "spike.action='skip', spike.backoff=False",
    'E': f"spike.action='log', snapshot_interval={WARMUP}",
    'F': "spike.action='skip', spike.factor=5",
}


# -- the detector's rule, replayed ----------------------------------------
def replay_rule(
    series: List[Dict[str, Any]],
    factor: float = 10.0,
    window: int = 50,
    warmup: int = WARMUP,
) -> List[Dict[str, float]]:
    """Each recorded step's quantities, as the detector's rule sees them,
    in float64 and in plain Python.

    A quantity is checked when it is finite, at least ``warmup`` of its
    values were admitted and the max of its last ``window`` admitted
    values is > 0; it is flagged when it exceeds ``factor`` times that
    max. Admitted: finite, not flagged, and for the grad norm, no loss
    quantity flagged in the same step. Steps without a verdict
    (``values`` None) are passed over.

    Args:
        series (list[dict]): Per iteration, ``values``: quantity -> float
            (or None).

    Returns:
        list[dict]: Per entry of ``series``, the checked quantities ->
        value / running max (flagged: ratio > ``factor``).
    """
    admitted: Dict[str, List[float]] = {}
    ratios_all = []
    for entry in series:
        values = entry.get('values') or {}
        ratios = {}
        for name, value in values.items():
            past = admitted.get(name, [])[-window:]
            if value is None or not math.isfinite(value):
                continue
            ref = max(past) if past else -math.inf
            if len(past) >= warmup and ref > 0:
                ratios[name] = value / ref
        flagged = {n for n, r in ratios.items() if r > factor}
        loss_flagged = any(not n.startswith('grad_norm') for n in flagged)
        for name, value in values.items():
            if value is None or not math.isfinite(value) or name in flagged:
                continue
            if name.startswith('grad_norm') and loss_flagged:
                continue
            admitted.setdefault(name, []).append(float(value))
        ratios_all.append(ratios)
    return ratios_all


def flagged_names(ratios: Dict[str, float], factor: float = 10.0) -> List[str]:
    """The quantities of one step above ``factor`` x their running max."""
    return sorted(n for n, r in ratios.items() if r > factor)


# -- one run ---------------------------------------------------------------
def _iteration_schedulers(config: str, scratch: str) -> List[bool]:
    """Per upstream param scheduler: whether it steps per iteration."""
    from zoo_cell import load_with_include

    cfg = load_with_include(config, scratch, 'none')
    schedulers = cfg.get('param_scheduler') or []
    if isinstance(schedulers, dict):
        schedulers = [schedulers]
    return [s.get('by_epoch', True) is False for s in schedulers]


def build_config(
    case: Dict[str, Any],
    setting: str,
    work_dir: str,
    data_dir: str,
    img_side: int,
):
    """The run's config: upstream + include, shrunk, the case's lr, the
    iteration schedulers only, the setting's guard options."""
    from zoo_cell import build_cell_config

    keep = _iteration_schedulers(case['config'], osp.join(work_dir, 'orig'))
    cfg, notes = build_cell_config(
        case['config'],
        work_dir,
        data_dir,
        fault=None,
        max_iters=case['iters'],
        fault_iter=0,
        include='nanguard',
        img_side=img_side,
    )
    schedulers = cfg.get('param_scheduler') or []
    cfg.param_scheduler = [s for s, k in zip(schedulers, keep) if k] or None
    if case['lr'] is not None:
        cfg.optim_wrapper.optimizer.lr = case['lr']
    guard = dict(cfg.nanguard)
    if case['kind'] == 'explosion':
        guard['policy'] = 'rollback'
    options = SETTINGS[setting]
    if 'spike' in options:
        guard['spike'] = dict(guard.get('spike') or {}, **options['spike'])
    guard.update({k: v for k, v in options.items() if k != 'spike'})
    cfg.nanguard = guard
    cfg.default_hooks.logger.interval = 10
    return cfg, notes


def _recorder():
    from mmengine.hooks import Hook

    from mmnanguard.engine.hooks import NanGuardHook

    class Recorder(Hook):
        """Per iteration: what the guard saw and did. Observes only (every
        value read is a host value the guard already read)."""

        priority = 'LOWEST'

        def __init__(self) -> None:
            self.series: List[Dict[str, Any]] = []
            self._rollbacks = 0

        def after_train_iter(
            self, runner, batch_idx, data_batch=None, outputs=None
        ) -> None:
            guard = next(
                h for h in runner.hooks if isinstance(h, NanGuardHook)
            )
            outcome = guard.step_guard.outcome
            verdict = outcome.last
            entry: Dict[str, Any] = dict(
                iter=runner.iter,
                lr=_live_lr(runner),
                steps=outcome.steps,
                skipped=outcome.skipped,
            )
            if verdict is not None:
                values = {
                    k: v
                    for k, v in verdict.loss_terms.items()
                    if 'loss' in k and isinstance(v, (int, float))
                }
                values['grad_norm'] = verdict.grad_norm
                entry.update(
                    values=values,
                    loss=verdict.loss_terms.get('loss'),
                    grad_norm=verdict.grad_norm,
                    finite=bool(
                        verdict.loss_finite
                        and verdict.grad_finite
                        and verdict.params_finite is not False
                    ),
                    spikes=sorted(s.name for s in verdict.spikes),
                )
            counters = guard.counters
            if counters['rollbacks'] > self._rollbacks:
                self._rollbacks = counters['rollbacks']
                entry['rolled_back_to'] = guard.last_restored.iteration
            entry['lr_factor'] = guard.lr_backoff.multiplier
            self.series.append(entry)

    return Recorder()


def _live_lr(runner) -> float:
    """The lr of the first param group of the optimizer (the live one)."""
    from mmnanguard.engine.guard.optim_members import optim_wrapper_members

    wrapper = optim_wrapper_members(runner.optim_wrapper)[0]
    return float(wrapper.optimizer.param_groups[0]['lr'])


def summarize(
    series: List[Dict[str, Any]], own_factor: float = 10.0
) -> Dict[str, Any]:
    """The figures of one run from its recorded series.

    Args:
        series (list[dict]): The recorded iterations.
        own_factor (float): The run's ``spike.factor``: the replay at it
            is compared with the online detector. Damaging steps are
            always those of the shipped rule (factor 10).
    """
    ratios = replay_rule(series)
    own = [
        flagged_names(r, own_factor) for r in replay_rule(series, own_factor)
    ]
    rule = [flagged_names(r) for r in ratios]
    unflagged = [
        (ratio, name, e['iter'])
        for e, r in zip(series, ratios)
        for name, ratio in r.items()
        if ratio <= 10.0
    ]
    top = max(unflagged, default=None)
    online = [e.get('spikes', []) for e in series]
    first_bad = next(
        (i for i, e in enumerate(series) if e.get('finite') is False), None
    )
    before = series if first_bad is None else series[:first_bad]
    damaging = [
        e['iter'] for e, flags in zip(before, rule) if flags and e['steps'] > 0
    ]
    damaging_after = [
        e['iter']
        for e, flags in zip(series[len(before) :], rule[len(before) :])
        if flags and e['steps'] > 0
    ]
    applied = [
        e['grad_norm']
        for e in before
        if e['steps'] > 0 and e.get('grad_norm') is not None
    ]
    rollbacks = [
        dict(at=e['iter'], to=e['rolled_back_to'])
        for e in series
        if 'rolled_back_to' in e
    ]
    finite_norms = [
        e['grad_norm']
        for e in series
        if e.get('grad_norm') is not None and math.isfinite(e['grad_norm'])
    ]
    return dict(
        first_nonfinite_iter=None
        if first_bad is None
        else series[first_bad]['iter'],
        nonfinite_iters=sum(e.get('finite') is False for e in series),
        damaging_steps=len(damaging),
        damaging_iters=damaging,
        damaging_steps_after_first_nonfinite=len(damaging_after),
        damaging_iters_after_first_nonfinite=damaging_after,
        flagged_steps=sum(bool(f) for f in rule),
        flagged_iters=[e['iter'] for e, f in zip(series, rule) if f],
        max_ratio_not_flagged=None
        if top is None
        else dict(ratio=round(top[0], 2), quantity=top[1], iter=top[2]),
        rule_agrees_with_detector=all(
            sorted(a) == sorted(b) for a, b in zip(own, online)
        ),
        max_applied_grad_norm_before_nonfinite=max(applied, default=None),
        median_grad_norm_first_10=sorted(finite_norms[:10])[
            len(finite_norms[:10]) // 2
        ]
        if finite_norms
        else None,
        skipped_steps=sum(e['skipped'] for e in series),
        rollbacks=rollbacks,
        lr_peak=max(e['lr'] for e in series) if series else None,
        lr_last=series[-1]['lr'] if series else None,
        lr_factor_last=series[-1]['lr_factor'] if series else None,
    )


def _factor(result: Dict[str, Any]) -> float:
    """The ``spike.factor`` a run used."""
    return float((result['guard'].get('spike') or {}).get('factor', 10.0))


def run_one(
    case_name: str,
    setting: str,
    work_dir: str,
    data_dir: str,
    img_side: int,
) -> Dict[str, Any]:
    """Train one (case, setting) in this process and summarize it."""
    import torch
    from mmengine.hooks import EMAHook
    from mmengine.registry import RUNNERS

    from mmnanguard.testing import tensors_all_finite

    torch.set_num_threads(1)
    case = CASES[case_name]
    result: Dict[str, Any] = dict(
        case=case_name, setting=setting, **case, img_side=img_side
    )
    cfg, notes = build_config(case, setting, work_dir, data_dir, img_side)
    result['guard'] = {
        k: cfg.nanguard.get(k)
        for k in ('policy', 'snapshot_interval', 'spike', 'max_rollbacks')
    }
    result['schedulers'] = [s['type'] for s in cfg.param_scheduler or []]
    result['code'] = _code_version()
    runner = RUNNERS.build(cfg)
    recorder = _recorder()
    runner.register_hook(recorder)
    start = time.perf_counter()
    try:
        runner.train()
        result['stopped'] = None
    except Exception as err:  # a stop is the run's result
        result['stopped'] = f'{type(err).__name__}: {err}'[:600]
    result['wall_s'] = round(time.perf_counter() - start, 1)
    ema = next((h for h in runner.hooks if isinstance(h, EMAHook)), None)
    from mmnanguard.engine.hooks import NanGuardHook

    guard = next(h for h in runner.hooks if isinstance(h, NanGuardHook))
    result.update(
        iters_run=len(recorder.series),
        counters=dict(guard.counters),
        weights_finite=tensors_all_finite(runner.model.state_dict()),
        ema_finite=None
        if ema is None
        else tensors_all_finite(ema.ema_model.state_dict()),
        last_loss=next(
            (
                e['loss']
                for e in reversed(recorder.series)
                if e.get('loss') is not None
            ),
            None,
        ),
        **summarize(recorder.series, _factor(result)),
        series=recorder.series,
    )
    return result


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ['git', *args], cwd=REPO, capture_output=True, text=True
        ).stdout
    except OSError:
        return ''


def _code_version() -> str:
    """The commit and a digest of the uncommitted changes of the package
    (the working tree this run imported)."""
    diff = _git('diff', 'HEAD', '--', 'mmnanguard', 'configs')
    digest = hashlib.sha1(diff.encode()).hexdigest()[:10] if diff else ''
    commit = _git('rev-parse', '--short', 'HEAD').strip()
    return f'{commit}+{digest}' if digest else commit


def run_toolbox(which: str, setting: str, work_dir: str) -> Dict[str, Any]:
    """A clean 60-iteration run of YOLOv5-s (mmyolo) or ResNet-18
    (mmpretrain) with the include, shrunk as ``tests/test_toolboxes``
    shrinks them (widths / 8 and 64 px for YOLOv5-s; base width 16 and
    32 px crops of a generated ImageFolder for ResNet-18), under the
    toolboxes stack. ``shrink_runtime`` keeps every scheduler, by
    iteration."""
    import torch
    from mmengine.config import Config
    from mmengine.registry import RUNNERS

    from mmnanguard.datagen import generate_coco, generate_image_folder
    from mmnanguard.testing import tensors_all_finite
    from mmnanguard.testing.shrink import shrink_runtime

    sys.path[:0] = [osp.join(REPO, 'tests', 'test_toolboxes')]
    sys.path[:0] = [osp.join(REPO, 'tests')]
    from toolbox_runs import upstream_config

    torch.set_num_threads(1)
    os.makedirs(work_dir, exist_ok=True)
    if which == 'yolov5_s':
        from test_mmyolo import CONFIGS, shrink_yolo

        root = osp.join(work_dir, 'coco')
        generate_coco(root, num_images=8, seed=0)
        upstream = upstream_config('mmyolo', CONFIGS[0])
        shrink = shrink_yolo(root)
    else:
        from test_mmpretrain import shrink_resnet

        folder = generate_image_folder(osp.join(work_dir, 'imgs'), seed=0)
        upstream = upstream_config(
            'mmpretrain', 'resnet/resnet18_8xb32_in1k.py'
        )

        def shrink(cfg):
            shrink_resnet(cfg, folder)

    path = osp.join(work_dir, 'user_config.py')
    with open(path, 'w') as f:
        f.write(f"_base_ = [{upstream!r}, 'mmnanguard::_base_/nanguard.py']\n")
    cfg = Config.fromfile(path)
    shrink(cfg)
    shrink_runtime(cfg, work_dir, max_iters=60, batch_size=2)
    guard = dict(cfg.nanguard)
    options = SETTINGS[setting]
    if 'spike' in options:
        guard['spike'] = dict(guard.get('spike') or {}, **options['spike'])
    guard.update({k: v for k, v in options.items() if k != 'spike'})
    cfg.nanguard = guard
    cfg.default_hooks.logger.interval = 10
    result: Dict[str, Any] = dict(
        case=which,
        setting=setting,
        config=upstream.split('.mim/configs/')[-1],
        guard={
            k: guard.get(k) for k in ('policy', 'snapshot_interval', 'spike')
        },
        code=_code_version(),
    )
    runner = RUNNERS.build(cfg)
    recorder = _recorder()
    runner.register_hook(recorder)
    start = time.perf_counter()
    try:
        runner.train()
        result['stopped'] = None
    except Exception as err:  # a stop is the run's result
        result['stopped'] = f'{type(err).__name__}: {err}'[:600]
    from mmnanguard.engine.hooks import NanGuardHook

    hook = next(h for h in runner.hooks if isinstance(h, NanGuardHook))
    result.update(
        wall_s=round(time.perf_counter() - start, 1),
        iters_run=len(recorder.series),
        counters=dict(hook.counters),
        weights_finite=tensors_all_finite(runner.model.state_dict()),
        last_loss=recorder.series[-1].get('loss') if recorder.series else None,
        **summarize(recorder.series, _factor(result)),
        series=recorder.series,
    )
    return result


# -- the driver --------------------------------------------------------------
def _meta() -> Dict[str, Any]:
    return dict(
        commit=_git('rev-parse', '--short', 'HEAD').strip(),
        dirty_files=_git('status', '--short', '--', 'mmnanguard').splitlines(),
        python=platform.python_version(),
        cpus=os.cpu_count(),
        settings=SETTING_NAMES,
        started=time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime()),
    )


def run_all(args) -> None:
    """Each (case, setting) in its own interpreter; the JSON is rewritten
    after each."""
    out: Dict[str, Any] = dict(meta=_meta(), runs=[])
    if args.resume and osp.isfile(args.out):
        with open(args.out) as f:
            out = json.load(f)
    done = {(r['case'], r['setting']) for r in out['runs']}
    os.makedirs(args.scratch, exist_ok=True)
    data_dir = osp.join(args.scratch, 'data')
    for case in args.cases:
        for setting in args.settings:
            if (case, setting) in done:
                continue
            work = osp.join(args.scratch, f'{case}_{setting}')
            cell_out = osp.join(work, 'result.json')
            os.makedirs(work, exist_ok=True)
            cmd = [
                sys.executable,
                __file__,
                'cell',
                case,
                setting,
                '--work-dir',
                work,
                '--data-dir',
                data_dir,
                '--img-side',
                str(args.img_side),
                '--out',
                cell_out,
            ]
            env = dict(
                os.environ,
                OMP_NUM_THREADS='1',
                MKL_NUM_THREADS='1',
                PYTHONWARNINGS='ignore',
            )
            start = time.perf_counter()
            with open(osp.join(work, 'run.log'), 'w') as log:
                try:
                    rc = subprocess.run(
                        cmd,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=env,
                        timeout=args.timeout,
                    ).returncode
                except subprocess.TimeoutExpired:
                    rc = 'timeout'
            if osp.isfile(cell_out):
                with open(cell_out) as f:
                    result = json.load(f)
            else:
                result = dict(case=case, setting=setting, error=f'rc={rc}')
            result['process_s'] = round(time.perf_counter() - start, 1)
            out['runs'].append(result)
            print(_line(result), flush=True)
            with open(args.out, 'w') as f:
                json.dump(out, f, indent=1, default=str)
    out['meta']['finished'] = time.strftime(
        '%Y-%m-%d %H:%M:%S UTC', time.gmtime()
    )
    with open(args.out, 'w') as f:
        json.dump(out, f, indent=1, default=str)


def _line(r: Dict[str, Any]) -> str:
    if 'error' in r:
        return f"{r['case']} {r['setting']}: {r['error']}"
    return (
        f"{r['case']} {r['setting']}: first nonfinite "
        f"{r['first_nonfinite_iter']}, damaging {r['damaging_steps']}, "
        f"skipped {r['skipped_steps']}, rollbacks {r['rollbacks']}, "
        f"finite {r['weights_finite']}, stopped {r['stopped']}, "
        f"{r['wall_s']} s"
    )


def _fmt(value: Optional[float]) -> str:
    if value is None:
        return '-'
    return f'{value:.3g}'


def _iters(values: List[int]) -> str:
    return f" ({', '.join(map(str, values))})" if values else ''


def markdown(path: str) -> str:
    """The table of RESULTS.md from the JSON."""
    with open(path) as f:
        data = json.load(f)
    header = (
        'case',
        'setting',
        'iters',
        'flagged by the rule (iters)',
        'damaging: flagged and applied before the 1st NaN/inf (after it)',
        'largest unflagged ratio to the running max',
        'max applied grad norm before it, or in the run (median of '
        'iters 0-9)',
        '1st NaN/inf',
        'steps skipped',
        'rollbacks (at->to)',
        'lr factor at the end',
        'end: weights finite, last loss',
        'stopped',
        'wall s',
    )
    rows = [
        '| ' + ' | '.join(header) + ' |',
        '|' + '---|' * len(header),
    ]
    order = {name: i for i, name in enumerate(CASES)}
    runs = sorted(
        data['runs'], key=lambda r: (order.get(r['case'], 99), r['setting'])
    )
    for r in runs:
        if 'error' in r:
            cells = [r['case'], r['setting'], r['error']]
            rows.append('| ' + ' | '.join(cells) + ' |' * (len(header) - 2))
            continue
        r = dict(r, **summarize(r['series'], _factor(r)))  # replay again
        backs = ', '.join(f"{b['at']}->{b['to']}" for b in r['rollbacks'])
        first = r['first_nonfinite_iter']
        top = r['max_ratio_not_flagged']
        cells = [
            r['case'],
            r['setting'],
            str(r['iters_run']),
            f"{r['flagged_steps']}{_iters(r['flagged_iters'])}",
            f"{r['damaging_steps']}{_iters(r['damaging_iters'])}"
            + (
                f'; after it {len(after)}{_iters(after)}'
                if (after := r['damaging_iters_after_first_nonfinite'])
                else ''
            ),
            '-'
            if top is None
            else f"{top['ratio']} ({top['quantity']} @{top['iter']})",
            f"{_fmt(r['max_applied_grad_norm_before_nonfinite'])} "
            f"({_fmt(r['median_grad_norm_first_10'])})",
            '-'
            if first is None
            else f"{first} ({r['nonfinite_iters']} in all)",
            str(r['skipped_steps']),
            f"{r['counters']['rollbacks']}" + (f' ({backs})' if backs else ''),
            _fmt(r['lr_factor_last']),
            f"{r['weights_finite']}, {_fmt(r['last_loss'])}",
            r['stopped'].split(':')[0] if r['stopped'] else '-',
            str(r['wall_s']),
        ]
        rows.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(rows)


def diverged_at(data: Dict[str, Any]) -> List[str]:
    """Per case, the first iteration where B's or C's loss differs from
    A's (the settings differ only from the first flagged step, so the runs
    must agree exactly before it: a check of determinism)."""
    runs = {(r['case'], r['setting']): r for r in data['runs']}
    lines = []
    for (case, setting), run in runs.items():
        base = runs.get((case, 'A'))
        if setting == 'A' or base is None or 'series' not in run:
            continue
        first = next(
            (
                a['iter']
                for a, b in zip(base['series'], run['series'])
                if a.get('loss') != b.get('loss')
            ),
            None,
        )
        flagged = base['flagged_iters'][:1]
        lines.append(
            f'{case} {setting} vs A: losses identical up to '
            + ('the end' if first is None else f'iteration {first} (excl.)')
            + f'; A first flagged {flagged[0] if flagged else "-"}'
        )
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest='command', required=True)
    run = sub.add_parser('run', help='every (case, setting)')
    run.add_argument('--out', required=True, help='result JSON')
    run.add_argument('--cases', nargs='+', default=list(CASES))
    run.add_argument('--settings', nargs='+', default=list(SETTINGS))
    run.add_argument('--img-side', type=int, default=128)
    run.add_argument('--timeout', type=int, default=900)
    run.add_argument('--scratch', default='/tmp/spike_defaults')
    run.add_argument(
        '--resume', action='store_true', help='keep the runs in --out'
    )
    cell = sub.add_parser('cell', help='one (case, setting), in-process')
    cell.add_argument('case', choices=CASES)
    cell.add_argument('setting', choices=SETTINGS)
    cell.add_argument('--work-dir', required=True)
    cell.add_argument('--data-dir', required=True)
    cell.add_argument('--img-side', type=int, default=128)
    cell.add_argument('--out', required=True)
    tb = sub.add_parser(
        'toolbox', help='YOLOv5-s / ResNet-18, clean (toolboxes stack)'
    )
    tb.add_argument('--out', required=True, help='result JSON')
    tb.add_argument('--settings', nargs='+', default=['A', 'B'])
    tb.add_argument('--scratch', default='/tmp/spike_defaults_toolboxes')
    md = sub.add_parser('markdown', help='the table, from the JSON')
    md.add_argument('json')
    args = parser.parse_args(argv)
    if args.command == 'run':
        unknown = [c for c in args.cases if c not in CASES] + [
            s for s in args.settings if s not in SETTINGS
        ]
        if unknown:
            parser.error(f'unknown cases/settings: {unknown}')
        run_all(args)
    elif args.command == 'cell':
        result = run_one(
            args.case,
            args.setting,
            args.work_dir,
            args.data_dir,
            args.img_side,
        )
        with open(args.out, 'w') as f:
            json.dump(result, f, indent=1, default=str)
    elif args.command == 'toolbox':
        runs = [
            run_toolbox(
                which, setting, osp.join(args.scratch, which + setting)
            )
            for which in ('yolov5_s', 'resnet18')
            for setting in args.settings
        ]
        with open(args.out, 'w') as f:
            json.dump(dict(meta=_meta(), runs=runs), f, indent=1, default=str)
        for r in runs:
            print(_line(r))
    else:
        print(markdown(args.json))
        with open(args.json) as f:
            print('\n'.join(diverged_at(json.load(f))))
    return 0


if __name__ == '__main__':
    sys.exit(main())
