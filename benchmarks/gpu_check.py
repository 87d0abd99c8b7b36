# Copyright (c) mmnanguard contributors. All rights reserved.
"""The checks that need a CUDA GPU, in one script that prints one table.

Sections (each independent: one that fails prints ``FAILED`` with the
reason, and the others still run):

a. ``AmpOptimWrapper`` fp16 on CUDA with a planted overflow (one
   parameter's gradient made inf at one iteration, toy model, guard
   ``policy='skip'``): the step is skipped (the weights of that iteration
   are unchanged), the weights stay finite, and the guard records it;
b. mmcv's CUDA ``sigmoid_focal_loss`` (what ``mmdet.FocalLoss`` runs on a
   GPU) against ``StableFocalLoss``: values and gradients on random logits
   (max abs diff) and on extreme logits (finite? diff where both finite);
c. mmrotate's ``RotatedIoULoss`` (mmcv's ``diff_iou_rotated_2d``, a CUDA
   op) against ``SafeRotatedIoULoss``: per-box loss (and gradient) on
   well-behaved boxes (max abs diff) and finiteness of loss and gradient
   on degenerate boxes;
d. host syncs per iteration of the tiny rotated RetinaNet DOTA config on
   CUDA, ``--guard off`` against ``--guard skip``: the warnings of
   ``torch.cuda.set_sync_debug_mode('warn')``, and the reads of
   :func:`mmnanguard.testing.host_syncs.count_host_syncs` (device tensors
   only);
e. overhead: median ms per iteration, guard on (``skip``) against guard
   off, 3 interleaved pairs (ratio per pair, median, min..max);
f. ``FlexibleRunner`` strategies that need a GPU (``docs/distributed.md``):
   ``FSDPStrategy`` (FSDP1) and ``DeepSpeedStrategy`` (ZeRO-2, when
   ``deepspeed`` is installed), ``torchrun`` with one process per GPU, the
   include selecting ``NanGuardFlexibleRunner`` from the ``strategy`` key,
   the tiny rotated RetinaNet, a NaN gradient at iteration 1 (skipped) and
   a NaN in the optimizer state at iteration 3 (after the checkpoint of
   iteration 2; rolled back from it, ``rollback_source='checkpoint'``):
   the incidents, the rollback's source and finite final weights, on
   every rank.

Usage::

    python benchmarks/gpu_check.py                 # on a CUDA machine
    python benchmarks/gpu_check.py --device cpu    # dry run on the CPU

Without a CUDA device (and without ``--device cpu``) it prints a one-line
message and exits 0. ``--device cpu`` runs what the CPU can, to catch
errors in the script itself (``CPUAmpOptimWrapper`` in a, mmdet's
pure-PyTorch focal loss in b, mmcv's ``box_iou_rotated`` in c, no
sync-debug count in d, fewer iterations in d and e, ``DDPStrategy`` over
gloo with 2 processes in f); its numbers say nothing about a GPU.
"""

import argparse
import math
import os
import os.path as osp
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

#: (check, value, ok) rows of a section; ok None: informational.
Row = Tuple[str, str, Optional[bool]]
SYNC_WARNING = 'synchroniz'  # "called a synchronizing CUDA operation"


def _fmt(x: float) -> str:
    return f'{x:.3g}'


def _finite(t) -> bool:
    import torch

    return bool(torch.isfinite(t).all())


# -- a. AMP with a planted overflow ------------------------------------------
def check_amp_overflow(device: str, ctx: Dict[str, Any]) -> List[Row]:
    """Section a."""
    import torch
    from mmengine.hooks import Hook
    from mmengine.runner import Runner

    import mmnanguard  # noqa: F401
    from mmnanguard.engine.hooks import NanGuardHook
    from mmnanguard.testing.toy import ToyModel, toy_runner_cfg

    plant_at = 3
    seen: Dict[str, Any] = {}

    class PlantInfGrad(Hook):
        """Make the gradient of ``a.weight`` inf at one iteration."""

        priority = 'HIGHEST'

        def __init__(self) -> None:
            self.handle = None

        def before_train_iter(self, runner, batch_idx, data_batch=None):
            model = runner.model
            if runner.iter in (plant_at, plant_at + 1):
                seen[runner.iter, 'before'] = _weights(model)
            if runner.iter == plant_at:
                self.handle = model.a.weight.register_hook(
                    lambda g: torch.full_like(g, float('inf'))
                )

        def after_train_iter(
            self, runner, batch_idx, data_batch=None, outputs=None
        ):
            if self.handle is not None:
                self.handle.remove()
                self.handle = None
            if runner.iter in (plant_at, plant_at + 1):
                seen[runner.iter, 'after'] = _weights(runner.model)

    def _weights(model):
        return {k: v.detach().clone() for k, v in model.state_dict().items()}

    def _unchanged(iteration):
        before, after = seen[iteration, 'before'], seen[iteration, 'after']
        return all(torch.equal(before[k], after[k]) for k in before)

    wrapper = 'AmpOptimWrapper' if device == 'cuda' else 'CPUAmpOptimWrapper'
    guard = NanGuardHook(policy='skip')
    with tempfile.TemporaryDirectory() as work_dir:
        runner = Runner(
            **toy_runner_cfg(
                work_dir,
                max_iters=6,
                custom_hooks=[guard, PlantInfGrad()],
                optim_wrapper=dict(
                    type=wrapper,
                    optimizer=dict(type='SGD', lr=0.01, momentum=0.9),
                    loss_scale='dynamic',
                    dtype='float16',
                ),
                model=ToyModel(),
                default_hooks=dict(
                    logger=dict(type='LoggerHook', interval=1),
                    checkpoint=None,
                ),
            )
        )
        runner.train()
    params = runner.model.state_dict()
    on = {v.device.type for v in params.values()}
    unchanged = _unchanged(plant_at)
    next_stepped = not _unchanged(plant_at + 1)
    counters = guard.counters
    recorded = counters['amp_skipped'] + counters['incidents']
    return [
        ('optim wrapper / params on', f'{wrapper} / {sorted(on)}', None),
        (
            f'step of iteration {plant_at} skipped (weights unchanged)',
            str(unchanged),
            unchanged,
        ),
        (
            f'step of iteration {plant_at + 1} taken (a control: the '
            'scale recovered)',
            str(next_stepped),
            None,
        ),
        (
            'weights finite after 6 iterations',
            str(all(_finite(v) for v in params.values())),
            all(_finite(v) for v in params.values()),
        ),
        (
            'recorded by the guard (amp_skipped, incidents, skipped)',
            f"{counters['amp_skipped']}, {counters['incidents']}, "
            f"{counters['skipped']}",
            recorded >= 1,
        ),
    ]


# -- b. focal loss ------------------------------------------------------------
def _upstream_focal(device: str) -> Tuple[str, Callable]:
    """``(name, f(pred, labels) -> per-element loss)``: mmcv's CUDA op, or
    on the CPU mmdet's pure-PyTorch ``py_sigmoid_focal_loss``."""
    import torch.nn.functional as F

    if device == 'cuda':
        from mmcv.ops import sigmoid_focal_loss

        return 'mmcv.ops.sigmoid_focal_loss (CUDA)', (
            lambda pred, labels: sigmoid_focal_loss(
                pred, labels, 2.0, 0.25, None, 'none'
            )
        )
    from mmdet.models.losses.focal_loss import py_sigmoid_focal_loss

    def reference(pred, labels):
        target = F.one_hot(labels, pred.size(1) + 1)[:, : pred.size(1)]
        return py_sigmoid_focal_loss(
            pred, target.type_as(pred), None, 2.0, 0.25, 'none'
        )

    return 'mmdet py_sigmoid_focal_loss (CPU stand-in)', reference


def check_focal_loss(device: str, ctx: Dict[str, Any]) -> List[Row]:
    """Section b."""
    import torch

    from mmnanguard.models.losses import StableFocalLoss

    name, upstream = _upstream_focal(device)
    stable = StableFocalLoss(reduction='none')
    gen = torch.Generator().manual_seed(0)
    n, c = 4096, 15
    labels = torch.randint(0, c + 1, (n,), generator=gen).to(device)
    cases = {
        'random logits N(0, 3)': torch.randn(n, c, generator=gen) * 3,
        'extreme logits (+-50, +-1e4, 0)': torch.tensor(
            [50.0, -50.0, 1e4, -1e4, 0.0]
        )
        .repeat(n * c // 5 + 1)[: n * c]
        .view(n, c),
    }
    rows: List[Row] = [('upstream', name, None)]
    for case, logits in cases.items():
        results = []
        for loss_fn in (upstream, stable):
            pred = logits.clone().to(device).requires_grad_(True)
            loss = loss_fn(pred, labels)
            loss.sum().backward()
            results.append((loss.detach().float(), pred.grad.float()))
        (lu, gu), (ls, gs) = results
        both = torch.isfinite(lu) & torch.isfinite(ls)
        gboth = torch.isfinite(gu) & torch.isfinite(gs)
        dv = (lu - ls)[both].abs().max().item() if both.any() else math.nan
        dg = (gu - gs)[gboth].abs().max().item() if gboth.any() else math.nan
        random_case = case.startswith('random')
        rows += [
            (
                f'{case}: max |loss diff| / |grad diff|',
                f'{_fmt(dv)} / {_fmt(dg)}',
                (dv < 1e-4 and dg < 1e-4) if random_case else None,
            ),
            (
                f'{case}: finite loss, grad (upstream; stable)',
                f'{_finite(lu)}, {_finite(gu)}; {_finite(ls)}, {_finite(gs)}',
                _finite(ls) and _finite(gs),
            ),
        ]
    return rows


# -- c. rotated IoU loss -----------------------------------------------------
def _boxes(gen, n: int):
    import torch

    xy = torch.rand(n, 2, generator=gen) * 100
    wh = torch.rand(n, 2, generator=gen) * 45 + 5
    angle = (torch.rand(n, 1, generator=gen) - 0.5) * math.pi
    return torch.cat([xy, wh, angle], 1)


def _upstream_rotated_iou(device: str) -> Tuple[str, Callable]:
    """``(name, f(pred, target) -> per-box loss)``: mmrotate's
    ``RotatedIoULoss`` (mmcv's ``diff_iou_rotated_2d``, CUDA only), or on
    the CPU ``-log`` of mmcv's ``box_iou_rotated`` (values only)."""
    if device == 'cuda':
        from mmrotate.models.losses import RotatedIoULoss

        return 'mmrotate RotatedIoULoss (CUDA)', RotatedIoULoss(
            reduction='none'
        )
    from mmcv.ops import box_iou_rotated

    def reference(pred, target):
        iou = box_iou_rotated(pred.detach(), target, aligned=True)
        return -iou.clamp(min=1e-6).log()

    return 'mmcv box_iou_rotated (CPU stand-in, no grad)', reference


def check_rotated_iou(device: str, ctx: Dict[str, Any]) -> List[Row]:
    """Section c."""
    import torch

    from mmnanguard.models.losses import SafeRotatedIoULoss

    name, upstream = _upstream_rotated_iou(device)
    safe = SafeRotatedIoULoss(reduction='none')
    gen = torch.Generator().manual_seed(0)
    pred = _boxes(gen, 2048)
    target = pred + torch.randn(pred.shape, generator=gen) * torch.tensor(
        [2.0, 2.0, 2.0, 2.0, 0.1]
    )
    target[:, 2:4] = target[:, 2:4].abs() + 1
    rows: List[Row] = [('upstream', name, None)]
    results = []
    for loss_fn in (upstream, safe):
        p = pred.clone().to(device).requires_grad_(True)
        loss = loss_fn(p, target.to(device))
        grad = None
        if loss.requires_grad:
            loss.sum().backward()
            grad = p.grad.float()
        results.append((loss.detach().float(), grad))
    (lu, gu), (ls, gs) = results
    diff = (lu - ls).abs().max().item()
    rows.append(
        ('well-behaved boxes: max |loss diff|', _fmt(diff), diff < 1e-3)
    )
    if gu is not None:
        gdiff = (gu - gs).abs().max().item()
        rows.append(('well-behaved boxes: max |grad diff|', _fmt(gdiff), None))
    box = [10.0, 10.0, 4.0, 2.0, 0.3]
    degenerate = {
        'zero width': ([10.0, 10.0, 0.0, 2.0, 0.3], box),
        'zero area, both': (
            [10.0, 10.0, 0.0, 0.0, 0.0],
            [10.0, 10.0, 0.0, 0.0, 0.0],
        ),
        'identical boxes': (box, box),
        'disjoint boxes': (box, [90.0, 90.0, 4.0, 2.0, 0.3]),
        'huge box (1e7)': ([10.0, 10.0, 1e7, 1e7, 0.0], box),
        'angle 1e4 rad': ([10.0, 10.0, 4.0, 2.0, 1e4], box),
    }
    for case, (p, t) in degenerate.items():
        values = []
        for loss_fn in (upstream, safe):
            pt = torch.tensor([p], device=device, requires_grad=True)
            loss = loss_fn(pt, torch.tensor([t], device=device))
            grad = None
            if loss.requires_grad:
                loss.sum().backward()
                grad = pt.grad
            values.append((loss.detach(), grad))
        (lu, gu), (ls, gs) = values
        upstream_text = f'{_finite(lu)}' + (
            ', no grad' if gu is None else f', grad {_finite(gu)}'
        )
        rows.append(
            (
                f'degenerate: {case}: finite (upstream; safe)',
                f'{upstream_text}; {_finite(ls)}, grad '
                f'{gs is not None and _finite(gs)}',
                _finite(ls) and gs is not None and _finite(gs),
            )
        )
    return rows


# -- d. and e.: the tiny rotated RetinaNet on the device --------------------
def _dota_root(ctx: Dict[str, Any]) -> str:
    if 'dota_root' not in ctx:
        from mmnanguard.datagen import generate_dota

        ctx['dota_root'] = osp.join(ctx['tmp'], 'dota')
        generate_dota(ctx['dota_root'], num_images=8, seed=0)
    return ctx['dota_root']


def tiny_dota_runner(ctx: Dict[str, Any], guard: str, iters: int):
    """The tiny rotated RetinaNet as ``tools/train.py --guard GUARD`` builds
    it, ``iters`` iterations, no checkpoint."""
    import uuid

    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner

    import mmnanguard  # noqa: F401
    from mmnanguard.engine.runner import train_options as opts
    from mmnanguard.testing import TINY_DOTA_CONFIG, load_tiny_config

    work_dir = osp.join(ctx['tmp'], f'run_{uuid.uuid4().hex[:8]}')
    cfg = load_tiny_config(
        TINY_DOTA_CONFIG, work_dir, _dota_root(ctx), max_iters=iters
    )
    cfg.default_hooks.checkpoint = None
    cfg.default_hooks.logger.interval = 10**6
    opts.apply_guard_option(cfg, guard)
    if 'runner_type' in cfg:
        runner = RUNNERS.build(cfg)
    else:
        runner = Runner.from_cfg(cfg)
    opts.build_for_training(runner)
    return runner


def _train_counting(runner, device: str, skip: int):
    """Train ``runner``; return the sync-debug warnings of each iteration
    after ``skip`` and the counter's per-iteration means."""
    import torch
    from mmengine.runner.loops import EpochBasedTrainLoop, IterBasedTrainLoop

    from mmnanguard.testing.host_syncs import count_host_syncs

    marks: List[int] = []
    with warnings.catch_warnings(record=True) as log:
        warnings.simplefilter('always')
        originals = {
            cls: cls.__dict__['run_iter']
            for cls in (EpochBasedTrainLoop, IterBasedTrainLoop)
        }

        def marking(original):
            def run_iter(loop, *args, **kwargs):
                marks.append(len(log))
                return original(loop, *args, **kwargs)

            return run_iter

        for cls, original in originals.items():
            cls.run_iter = marking(original)
        if device == 'cuda':
            torch.cuda.set_sync_debug_mode('warn')
        try:
            with count_host_syncs(host_tensors=device == 'cpu') as counts:
                runner.train()
        finally:
            if device == 'cuda':
                torch.cuda.set_sync_debug_mode('default')
            for cls, original in originals.items():
                cls.run_iter = original
        marks.append(len(log))
    syncs = [
        sum(
            SYNC_WARNING in str(w.message).lower()
            for w in log[marks[i] : marks[i + 1]]
        )
        for i in range(skip, len(marks) - 1)
    ]
    return syncs, counts.per_iteration(skip)


def check_sync_counts(device: str, ctx: Dict[str, Any]) -> List[Row]:
    """Section d."""
    iters, skip = ctx['sync_iters'], 2
    rows: List[Row] = []
    per_mode = {}
    for guard in ('off', 'skip'):
        runner = tiny_dota_runner(ctx, guard, iters)
        syncs, counted = _train_counting(runner, device, skip)
        per_mode[guard] = (
            statistics.mean(syncs) if syncs else math.nan,
            counted['reads'],
        )
        ctx.setdefault('sites', {})[guard] = counted['read_sites']
    for guard, label in (('off', 'bare (--guard off)'), ('skip', 'guard')):
        debug, reads = per_mode[guard]
        rows.append(
            (
                f'{label}: syncs/iter (sync debug mode; counter)',
                ('n/a on cpu' if device == 'cpu' else _fmt(debug))
                + f'; {_fmt(reads)}',
                None,
            )
        )
    added_debug = per_mode['skip'][0] - per_mode['off'][0]
    added_reads = per_mode['skip'][1] - per_mode['off'][1]
    rows.append(
        (
            'added by the guard (sync debug mode; counter), budget 0',
            ('n/a' if device == 'cpu' else _fmt(added_debug))
            + f'; {_fmt(added_reads)}',
            added_reads <= 0 and (device == 'cpu' or added_debug <= 0),
        )
    )
    own = {
        site: n
        for site, n in ctx['sites']['skip'].items()
        if site.startswith('mmnanguard/')
    }
    rows.append(('guard sites (counter)', str(own) if own else 'none', None))
    return rows


def check_overhead(device: str, ctx: Dict[str, Any]) -> List[Row]:
    """Section e."""
    iters, warmup, pairs = ctx['time_iters'], ctx['warmup'], ctx['pairs']
    ms: Dict[str, List[float]] = {'off': [], 'skip': []}
    for i in range(pairs):
        order = ('off', 'skip') if i % 2 == 0 else ('skip', 'off')
        for guard in order:
            runner = tiny_dota_runner(ctx, guard, iters)
            runner.train()
            times = runner.message_hub.get_scalar('train/time').data[0]
            ms[guard].append(1000 * statistics.median(times[warmup:]))
    ratios = [on / off for on, off in zip(ms['skip'], ms['off'])]
    return [
        (
            'ms/iter guard off (median of pairs; each pair)',
            f"{_fmt(statistics.median(ms['off']))}; "
            + ', '.join(_fmt(x) for x in ms['off']),
            None,
        ),
        (
            'ms/iter guard on (median of pairs; each pair)',
            f"{_fmt(statistics.median(ms['skip']))}; "
            + ', '.join(_fmt(x) for x in ms['skip']),
            None,
        ),
        (
            'ratio on/off: median (min..max)',
            f'{statistics.median(ratios):.3f} ({min(ratios):.3f}..'
            f'{max(ratios):.3f})',
            statistics.median(ratios) <= 1.01,
        ),
    ]


# -- f. FlexibleRunner strategies -------------------------------------------
#: strategy name -> its config (DeepSpeed: ZeRO-2, fp32)
STRATEGIES = {
    'FSDPStrategy': dict(type='FSDPStrategy'),
    'DeepSpeedStrategy': dict(
        type='DeepSpeedStrategy',
        zero_optimization=dict(stage=2),
        gradient_clipping=0.0,
    ),
    'DDPStrategy': dict(type='DDPStrategy'),
}


def flexible_worker(strategy: str, work_dir: str, data_root: str) -> int:
    """One rank of section f (started by ``torchrun``): train, then write
    ``work_dir/result_rank{RANK}.json`` (incidents, rollback source, final
    weights finite)."""
    import glob
    import json

    import torch
    from mmengine.dist import get_rank
    from mmengine.registry import RUNNERS

    import mmnanguard  # noqa: F401
    from mmnanguard.compat.cpu_distributed import prepare_cpu_distributed
    from mmnanguard.engine.runner import train_options as opts
    from mmnanguard.testing import TINY_DOTA_CONFIG, load_tiny_config

    cfg = load_tiny_config(TINY_DOTA_CONFIG, work_dir, data_root, max_iters=4)
    cfg.default_hooks.checkpoint = dict(
        type='CheckpointHook', interval=2, by_epoch=False
    )
    cfg.custom_hooks = [
        dict(type='FaultInjectionHook', fault='nan_grad', iteration=1),
        dict(
            type='FaultInjectionHook', fault='nan_optimizer_state', iteration=3
        ),
    ]
    cfg.optim_wrapper.optimizer.momentum = 0.9
    if strategy == 'DeepSpeedStrategy':
        cfg.optim_wrapper = dict(
            type='DeepSpeedOptimWrapper', optimizer=cfg.optim_wrapper.optimizer
        )
    cfg.strategy = STRATEGIES[strategy]
    cfg.launcher = 'pytorch'
    opts.apply_guard_option(cfg, 'skip')
    cfg.nanguard.rollback_source = 'checkpoint'
    prepare_cpu_distributed(cfg, 'pytorch')
    runner = RUNNERS.build(cfg)
    runner.train()
    reports = []
    for path in sorted(
        glob.glob(osp.join(work_dir, 'nanguard', '*', '*.json'))
    ):
        if path.endswith('report.json'):
            with open(path) as f:
                report = json.load(f)
            if report['rank'] == get_rank():
                reports.append(
                    [report['iteration'], report['kind'], report['action']]
                )
    restored = runner_guard_source(runner)
    finite = all(
        bool(torch.isfinite(p.detach()).all())
        for p in runner.model.parameters()
        if p.is_floating_point()
    )
    with open(osp.join(work_dir, f'result_rank{get_rank()}.json'), 'w') as f:
        json.dump(dict(reports=reports, restored=restored, finite=finite), f)
    return 0


def runner_guard_source(runner) -> Optional[str]:
    """Where the last rollback of the run's guard restored from."""
    from mmnanguard.engine.runner.checkpoint_agreement import guard_hook

    hook = guard_hook(runner)
    restored = hook.last_restored if hook is not None else None
    return None if restored is None else str(restored.source)


def check_strategies(device: str, ctx: Dict[str, Any]) -> List[Row]:
    """Section f."""
    import importlib.util
    import json
    import subprocess

    import torch

    from mmnanguard.testing.distributed import free_port, torchrun_args

    if device == 'cpu':
        names, procs = ['DDPStrategy'], 2
    else:
        names, procs = ['FSDPStrategy'], max(1, torch.cuda.device_count())
        if importlib.util.find_spec('deepspeed') is not None:
            names.append('DeepSpeedStrategy')
    rows: List[Row] = []
    if 'DeepSpeedStrategy' not in names and device != 'cpu':
        rows.append(('DeepSpeedStrategy', 'deepspeed not installed', None))
    for name in names:
        work_dir = osp.join(ctx['tmp'], f'strategy_{name}')
        os.makedirs(work_dir, exist_ok=True)
        cmd = (
            [sys.executable]
            + torchrun_args(procs, free_port())
            + [
                osp.abspath(__file__),
                '--flexible-worker',
                name,
                work_dir,
                _dota_root(ctx),
            ]
        )
        env = dict(os.environ, PYTHONWARNINGS='ignore')
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            tail = ' '.join(proc.stderr.split()[-60:])
            rows.append(
                (f'{name}: training', f'exit {proc.returncode}: {tail}', False)
            )
            continue
        results = []
        for rank in range(procs):
            with open(osp.join(work_dir, f'result_rank{rank}.json')) as f:
                results.append(json.load(f))
        first = results[0]
        expected = [
            [1, 'nonfinite_grad', 'skip'],
            [3, 'nonfinite_params', 'rollback'],
        ]
        rows += [
            (
                f'{name}: incidents (iteration, kind, action), {procs} rank',
                str(first['reports']),
                first['reports'] == expected
                and all(r['reports'] == first['reports'] for r in results),
            ),
            (
                f'{name}: rollback restored from',
                str(first['restored']),
                bool(first['restored'])
                and first['restored'].endswith('iter_2.pth')
                and all(r['restored'] == first['restored'] for r in results),
            ),
            (
                f'{name}: final weights finite on every rank',
                str([r['finite'] for r in results]),
                all(r['finite'] for r in results),
            ),
        ]
    return rows


SECTIONS = (
    ('a', 'AMP fp16, planted inf gradient', check_amp_overflow),
    ('b', 'sigmoid focal loss vs StableFocalLoss', check_focal_loss),
    ('c', 'RotatedIoULoss vs SafeRotatedIoULoss', check_rotated_iou),
    ('d', 'host syncs per iteration, tiny DOTA', check_sync_counts),
    ('e', 'overhead ms/iteration, tiny DOTA', check_overhead),
    ('f', 'FlexibleRunner strategies (FSDP1, DeepSpeed)', check_strategies),
)


def print_table(rows: List[Tuple[str, str, str, str]]) -> None:
    """One Markdown table: section | check | result | status."""
    print('| section | check | result | status |')
    print('|---|---|---|---|')
    for section, check, value, status in rows:
        value = value.replace('|', '/')
        print(f'| {section} | {check} | {value} | {status} |')


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ['--flexible-worker']:
        return flexible_worker(*argv[1:])
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        '--device',
        choices=['cuda', 'cpu'],
        default='cuda',
        help='cpu: dry run of what the CPU can run (default: cuda)',
    )
    parser.add_argument(
        '--sections',
        nargs='+',
        default=[s[0] for s in SECTIONS],
        choices=[s[0] for s in SECTIONS],
    )
    parser.add_argument('--pairs', type=int, help='pairs in e (default 3)')
    args = parser.parse_args(argv)
    if args.device == 'cpu':
        os.environ['CUDA_VISIBLE_DEVICES'] = ''
    import torch

    if args.device == 'cuda' and not torch.cuda.is_available():
        print(
            'gpu_check: no CUDA device: nothing checked (use --device cpu '
            'for a dry run of the script on the CPU).'
        )
        return 0
    dry = args.device == 'cpu'
    header = (
        'CPU dry run (the numbers say nothing about a GPU)'
        if dry
        else torch.cuda.get_device_name(0)
    )
    print(f'gpu_check on {header}; torch {torch.__version__}', flush=True)
    rows: List[Tuple[str, str, str, str]] = []
    with tempfile.TemporaryDirectory(prefix='gpu_check_') as tmp:
        ctx: Dict[str, Any] = dict(
            tmp=tmp,
            sync_iters=4 if dry else 8,
            time_iters=4 if dry else 24,
            warmup=1 if dry else 6,
            pairs=args.pairs or (1 if dry else 3),
        )
        for key, title, check in SECTIONS:
            if key not in args.sections:
                continue
            start = time.time()
            try:
                for name, value, ok in check(args.device, ctx):
                    status = '' if ok is None else ('ok' if ok else 'FAIL')
                    rows.append((f'{key}. {title}', name, value, status))
                took = f'{time.time() - start:.0f} s'
                rows.append((f'{key}. {title}', 'time', took, ''))
            except Exception as err:
                reason = ' '.join(f'{type(err).__name__}: {err}'.split())
                rows.append(
                    (f'{key}. {title}', 'FAILED', reason[:300], 'FAILED')
                )
                traceback.print_exc()
            print(f'section {key} done', flush=True)
    print()
    print_table(rows)
    return 0


if __name__ == '__main__':
    sys.exit(main())
