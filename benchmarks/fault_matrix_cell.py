# Copyright (c) mmnanguard contributors. All rights reserved.
"""One cell of the fault matrix: one fault, one protection mode, one config.

:func:`run_cell` trains a tiny real config for a few iterations with the
fault planted and the protection of the mode, and returns what happened:
whether and where the fault was detected, whether the weights and every
checkpoint on disk are finite, whether the run reached ``max_iters``,
whether the cause was named correctly, and the wall time. It runs in the
calling process (``benchmarks/fault_matrix.py`` calls it in a subprocess
per cell; the smoke test calls it directly).
"""

import glob
import json
import os.path as osp
import time
import traceback
from contextlib import nullcontext
from typing import Any, Dict, List, Optional, Tuple

import torch
from mmengine.hooks import Hook

#: Protection modes, in table order.
MODES = (
    'bare',
    'check_invalid_loss',
    'anomaly',
    'guard_raise',
    'guard_skip',
    'guard_rollback',
)
#: Fault -> how it is planted, and which report ``cause`` names it.
#: ``hook``: arguments of ``FaultInjectionHook``; ``data``: a planted
#: annotation (see ``fault_matrix.prepare_data``); ``amp``: the cell trains
#: under fp16 CPU autocast (``CPUAmpOptimWrapper``); ``img_scale`` and
#: ``max_iters`` override the cell's image size and length (fp16
#: convolutions run ~25x slower than fp32 on an AVX2 CPU without fp16
#: arithmetic, so the fp16 row trains 128 px images for 4 iterations).
FAULTS: Dict[str, Dict[str, Any]] = {
    'nan_pixel': dict(
        label='NaN pixel', hook=dict(fault='nan_pixel'), causes=('data',)
    ),
    'zero_width_box': dict(
        label='zero-width box', data='zero_width', causes=('data',)
    ),
    'inf_loss': dict(
        label='inf loss term', hook=dict(fault='inf_loss'), causes=('loss',)
    ),
    'nan_grad': dict(
        label='NaN grad, finite loss',
        hook=dict(fault='nan_grad'),
        causes=('backward',),
    ),
    'lr_spike': dict(
        label='lr spike (1e12)',
        hook=dict(fault='lr_spike'),
        causes=('explosion',),
    ),
    'nan_optimizer_state': dict(
        label='NaN optimizer state',
        hook=dict(fault='nan_optimizer_state'),
        causes=('optimizer',),
    ),
    'fp16_overflow': dict(
        label='fp16 overflow (autocast)',
        hook=dict(
            fault='scale_module', module_name='backbone.conv1', value=1e5
        ),
        amp=True,
        causes=('fp16_overflow',),
        img_scale=128,
        max_iters=4,
    ),
    'corrupt_line': dict(
        label='corrupt annotation (nan)',
        data='nan_coordinate',
        causes=('data',),
    ),
}
#: Exceptions that are a detection, by mode family.
GUARD_ERRORS = (
    'NonFiniteTrainingError',
    'PoisonedCheckpointError',
    'TrainingSpikeError',
    'InvalidAnnotationError',
    'AmpScaleCollapseError',
)


def _box_problems(boxes: Any) -> int:
    """Non-finite or zero-size gt boxes in a batch sample (any box type)."""
    tensor = getattr(boxes, 'tensor', boxes)
    if not isinstance(tensor, torch.Tensor) or tensor.numel() == 0:
        return 0
    tensor = tensor.float()
    bad = ~torch.isfinite(tensor).all(dim=1)
    if tensor.shape[1] == 5:  # rotated: cx, cy, w, h, angle
        wh = tensor[:, 2:4]
    else:  # horizontal: x1, y1, x2, y2
        wh = tensor[:, 2:4] - tensor[:, 0:2]
    bad |= (wh.abs() < 1e-3).any(dim=1)
    return int(bad.sum())


class MatrixProbe(Hook):
    """Records, per iteration, the batch's images, its broken gt boxes,
    the loss, and the ``ValidateAnnotations`` findings. Observes only."""

    priority = 'LOWEST'

    def __init__(self, fault_image: Optional[str] = None) -> None:
        self.fault_image = fault_image
        self.fault_iters: List[int] = []  # batches holding the fault image
        self.broken_boxes: Dict[int, int] = {}
        self.nonfinite_loss_iters: List[int] = []
        self.validate_iters: List[int] = []
        self._validate_seen = 0

    def _validators(self, runner) -> list:
        pipeline = getattr(runner.train_dataloader.dataset, 'pipeline', None)
        return [
            t
            for t in getattr(pipeline, 'transforms', [])
            if type(t).__name__ == 'ValidateAnnotations'
        ]

    def before_train_iter(
        self, runner, batch_idx: int, data_batch=None
    ) -> None:
        samples = (data_batch or {}).get('data_samples', [])
        paths = [s.metainfo.get('img_path', '') for s in samples]
        if self.fault_image and any(
            osp.basename(p) == osp.basename(self.fault_image) for p in paths
        ):
            self.fault_iters.append(runner.iter)
        bad = sum(_box_problems(s.gt_instances.bboxes) for s in samples)
        if bad:
            self.broken_boxes[runner.iter] = bad
        flagged = sum(v.num_invalid_samples for v in self._validators(runner))
        if flagged > self._validate_seen:
            self.validate_iters.append(runner.iter)
        self._validate_seen = flagged

    def after_train_iter(
        self, runner, batch_idx: int, data_batch=None, outputs=None
    ) -> None:
        loss = (outputs or {}).get('loss')
        if isinstance(loss, torch.Tensor) and not bool(
            torch.isfinite(loss).all()
        ):
            self.nonfinite_loss_iters.append(runner.iter)


def build_config(
    config: str,
    fault: str,
    mode: str,
    work_dir: str,
    data_root: str,
    max_iters: int,
    fault_iter: int,
    ckpt_interval: int,
) -> Tuple[Any, List[str]]:
    """The cell's config (the tiny config, the fault, the protection) and
    ``add_full_protection``'s notes.

    The sampler does not shuffle, so that a planted annotation reaches the
    model in the same, known iteration in every mode.
    """
    from full_protection import add_full_protection

    from mmnanguard.registry import HOOKS
    from mmnanguard.testing import (
        TINY_COCO_CONFIG,
        TINY_DOTA_CONFIG,
        load_tiny_config,
    )

    spec = FAULTS[fault]
    hooks: List[Dict[str, Any]] = []
    if 'hook' in spec:
        # LOWEST: the fault's model hooks are still in place when the
        # guard's incident listeners replay the batch, so the replay sees
        # the fault as it would see a deterministic bug (with the default
        # HIGHEST, they are removed first and the replay is clean)
        hooks.append(
            dict(
                type='FaultInjectionHook',
                iteration=fault_iter,
                priority='LOWEST',
                **spec['hook'],
            )
        )
    if mode == 'check_invalid_loss':
        hooks.append(dict(type='mmdet.CheckInvalidLossHook', interval=1))
    policy = mode[len('guard_') :] if mode.startswith('guard_') else None
    if policy:
        hooks.append(dict(type='NanGuardHook', policy=policy))
        if HOOKS.get('NanDiagnosisHook') is not None:
            hooks.append(dict(type='NanDiagnosisHook'))
    path = dict(dota=TINY_DOTA_CONFIG, coco=TINY_COCO_CONFIG)[config]
    cfg = load_tiny_config(
        path, work_dir, data_root, max_iters=max_iters, custom_hooks=hooks
    )
    cfg.default_hooks.checkpoint = dict(
        type='CheckpointHook',
        interval=ckpt_interval,
        by_epoch=False,
        max_keep_ckpts=-1,
    )
    cfg.default_hooks.logger.interval = 1
    cfg.train_dataloader.sampler.shuffle = False
    if spec.get('img_scale'):
        for transform in cfg.train_dataloader.dataset.pipeline:
            if transform['type'].split('.')[-1] == 'Resize':
                transform['scale'] = (spec['img_scale'],) * 2
    if spec.get('amp'):
        cfg.optim_wrapper.type = 'CPUAmpOptimWrapper'
        cfg.optim_wrapper.dtype = 'float16'
        cfg.optim_wrapper.loss_scale = 'dynamic'
    notes: List[str] = []
    if policy:
        notes = add_full_protection(
            cfg, validate_policy='raise' if policy == 'raise' else 'warn'
        )
    return cfg, notes


def _checkpoints(work_dir: str) -> Dict[str, bool]:
    """Every ``.pth`` the run wrote (incident ``batch.pth`` excluded) ->
    whether all its tensors are finite."""
    from mmnanguard.testing import tensors_all_finite

    out = {}
    for path in sorted(glob.glob(osp.join(work_dir, '*.pth'))):
        # our own run's files: full unpickling is safe here
        ckpt = torch.load(path, map_location='cpu', weights_only=False)
        out[osp.basename(path)] = tensors_all_finite(
            dict(
                state_dict=ckpt.get('state_dict'),
                optimizer=ckpt.get('optimizer'),
            )
        )
    return out


def _reports(work_dir: str) -> List[Dict[str, Any]]:
    reports = []
    for path in sorted(
        glob.glob(osp.join(work_dir, 'nanguard', '*', 'report.json'))
    ):
        with open(path) as f:
            reports.append(json.load(f))
    return reports


def _detection(
    mode: str,
    error: Optional[BaseException],
    error_iter: int,
    reports: List[Dict[str, Any]],
    probe: MatrixProbe,
) -> Dict[str, Any]:
    """Whether, where and by what the fault was detected."""
    found = []  # (iteration, detector)
    name = type(error).__name__ if error is not None else None
    tb = ''.join(traceback.format_tb(error.__traceback__)) if error else ''
    if (
        mode == 'check_invalid_loss'
        and isinstance(error, AssertionError)
        and 'checkloss_hook' in tb
    ):
        found.append((error_iter, 'CheckInvalidLossHook'))
    if (
        mode == 'anomaly'
        and isinstance(error, RuntimeError)
        and ('returned nan values' in str(error))
    ):
        op = str(error).split("'")[1] if "'" in str(error) else '?'
        found.append((error_iter, f'anomaly ({op})'))
    if mode.startswith('guard_'):
        if reports:
            found.append(
                (
                    reports[0]['iteration'],
                    f"NanGuardHook ({reports[0]['kind']})",
                )
            )
        if probe.validate_iters:
            found.append((probe.validate_iters[0], 'ValidateAnnotations'))
        if name in GUARD_ERRORS and not reports:
            found.append((error_iter, name))
    crashed = error is not None and not found
    if not found:
        return dict(
            detected=False, detect_iter=None, detector=None, crashed=crashed
        )
    detect_iter, detector = min(found)
    return dict(
        detected=True,
        detect_iter=detect_iter,
        detector=detector,
        crashed=False,
    )


def _cause(
    fault: str,
    mode: str,
    error: Optional[BaseException],
    reports: List[Dict[str, Any]],
) -> Dict[str, Any]:
    """The cause the mode names, and whether it is the right one."""
    expected = FAULTS[fault]['causes']
    if not mode.startswith('guard_'):
        return dict(
            cause=None, cause_ok=None, cause_note='this mode names no cause'
        )
    if not reports:
        if type(error).__name__ == 'InvalidAnnotationError':
            return dict(
                cause='data (InvalidAnnotationError)',
                cause_ok='data' in expected,
                cause_note=str(error).splitlines()[0][:200],
            )
        return dict(cause=None, cause_ok=None, cause_note='no report')
    report = reports[0]
    cause = report.get('cause')
    if cause is None:
        return dict(
            cause=None,
            cause_ok=None,
            cause_note=f"report kind={report['kind']}, no `cause` "
            'key (diagnosis not installed)',
        )
    fp16 = bool((report.get('diagnosis') or {}).get('fp16_overflow'))
    ok = fp16 if expected == ('fp16_overflow',) else cause in expected
    summary = (report.get('diagnosis') or {}).get('summary', '')
    label = f'{cause}, fp16_overflow' if fp16 else cause
    return dict(cause=label, cause_ok=ok, cause_note=summary[:300])


def run_cell(
    config: str,
    fault: str,
    mode: str,
    work_dir: str,
    data_root: str,
    fault_image: Optional[str] = None,
    max_iters: int = 6,
    fault_iter: int = 2,
    ckpt_interval: int = 2,
) -> Dict[str, Any]:
    """Train one cell of the matrix in this process.

    Args:
        config (str): ``'dota'`` (mmrotate rotated RetinaNet) or ``'coco'``
            (mmdet RetinaNet).
        fault (str): A key of :data:`FAULTS`.
        mode (str): One of :data:`MODES`.
        work_dir (str): The run's work dir (checkpoints, incidents).
        data_root (str): The generated data set (with the planted
            annotation for data faults).
        fault_image (str, optional): Image whose annotation is planted.
        max_iters (int): Training iterations.
        fault_iter (int): Iteration a hook fault is planted in.
        ckpt_interval (int): Checkpoint every this many iterations.

    Returns:
        dict: The cell's values (see ``fault_matrix.py``).

    Raises:
        ValueError: For an unknown ``config``, ``fault`` or ``mode``.
    """
    from mmengine.runner import Runner

    import mmnanguard  # noqa: F401  (stack mends, registrations)
    from mmnanguard.testing import tensors_all_finite

    if (
        fault not in FAULTS
        or mode not in MODES
        or config not in ('dota', 'coco')
    ):
        raise ValueError(
            f'unknown cell {config}/{fault}/{mode}; expected '
            f"config in ('dota', 'coco'), fault in "
            f'{tuple(FAULTS)}, mode in {MODES}'
        )
    max_iters = min(max_iters, FAULTS[fault].get('max_iters', max_iters))
    cfg, notes = build_config(
        config,
        fault,
        mode,
        work_dir,
        data_root,
        max_iters,
        fault_iter,
        ckpt_interval,
    )
    probe = MatrixProbe(fault_image)
    error, runner = None, None
    anomaly = (
        torch.autograd.set_detect_anomaly(True)
        if mode == 'anomaly'
        else nullcontext()
    )
    start = time.perf_counter()
    with anomaly:
        try:
            runner = Runner.from_cfg(cfg)
            runner.register_hook(probe)
            runner.train()
        except Exception as err:  # a cell's failure is its result
            error = err
    wall = time.perf_counter() - start
    if runner is None:
        raise RuntimeError(
            f'{config}/{fault}/{mode}: the runner could not '
            f'be built: {error!r}'
        ) from error
    reports = _reports(work_dir)
    ckpts = _checkpoints(work_dir)
    guard = next(
        (h for h in runner.hooks if type(h).__name__ == 'NanGuardHook'), None
    )
    planted = [
        h for h in runner.hooks if type(h).__name__ == 'FaultInjectionHook'
    ]
    if 'data' in FAULTS[fault]:
        fault_at = probe.fault_iters[0] if probe.fault_iters else fault_iter
        reached_model = bool(probe.broken_boxes) or (
            error is not None and not probe.fault_iters
        )
    else:
        fault_at = (
            planted[0].injected_at[0]
            if planted and planted[0].injected_at
            else None
        )
        reached_model = fault_at is not None
    result = dict(
        config=config,
        fault=fault,
        mode=mode,
        fault_iter=fault_at,
        fault_reached_model=reached_model,
        weights_finite=tensors_all_finite(
            runner.model.state_dict()
        ),  # params and BN buffers
        checkpoints=ckpts,
        checkpoints_finite=all(ckpts.values()),
        reached_max_iters=error is None and runner.iter == max_iters,
        final_iter=runner.iter,
        error=None
        if error is None
        else f'{type(error).__name__}: {str(error).splitlines()[0][:300]}'
        if str(error)
        else type(error).__name__,
        nonfinite_loss_iters=probe.nonfinite_loss_iters,
        last_loss_finite=error is None
        and (max_iters - 1) not in probe.nonfinite_loss_iters,
        broken_box_iters=sorted(probe.broken_boxes),
        incidents=[
            dict(
                iteration=r['iteration'],
                kind=r['kind'],
                action=r['action'],
                cause=r.get('cause'),
            )
            for r in reports
        ],
        counters=dict(guard.counters) if guard is not None else None,
        protection_notes=notes,
        wall_s=wall,
        max_iters=max_iters,
    )
    result.update(_detection(mode, error, runner.iter, reports, probe))
    result['detect_delta'] = (
        None
        if not result['detected'] or fault_at is None
        else result['detect_iter'] - fault_at
    )
    result.update(_cause(fault, mode, error, reports))
    result['outcome'] = outcome(result)
    return result


#: Outcome -> meaning, in legend order.
OUTCOMES = {
    'recovered': 'detected; weights and checkpoints finite; reached '
    'max_iters with a finite loss',
    'stalled': 'detected; weights and checkpoints finite; reached '
    'max_iters, but the last loss is still non-finite (updates dropped)',
    'stopped_clean': 'detected and stopped; weights and checkpoints finite',
    'detected_poisoned': 'detected, but the weights or a checkpoint are '
    'non-finite',
    'silent_finite': 'not detected; weights and checkpoints finite',
    'ruined': 'not detected; weights or a checkpoint non-finite',
    'crashed': 'stopped by an error that is not a detection',
    'no_fault': 'the fault never reached the model (filtered at loading)',
}


def outcome(cell: Dict[str, Any]) -> str:
    """Classify a cell into one of :data:`OUTCOMES`."""
    finite = cell['weights_finite'] and cell['checkpoints_finite']
    if (
        not cell['fault_reached_model']
        and not cell['detected']
        and cell['error'] is None
    ):
        return 'no_fault'
    if cell['crashed']:
        return 'crashed'
    if cell['detected']:
        if not finite:
            return 'detected_poisoned'
        if not cell['reached_max_iters']:
            return 'stopped_clean'
        return 'recovered' if cell['last_loss_finite'] else 'stalled'
    return 'silent_finite' if finite else 'ruined'
