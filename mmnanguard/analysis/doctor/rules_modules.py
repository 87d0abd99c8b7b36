# Copyright (c) mmnanguard contributors. All rights reserved.
"""Rules on the model's modules: loss weights, known-fragile modules that
have a safe drop-in, and BatchNorm ``eps`` at a per-GPU batch of 1-2."""

from typing import List, Tuple

from mmengine.registry import MODELS, TASK_UTILS
from torch.nn.modules.batchnorm import _BatchNorm

from mmnanguard.config_walk import iter_typed_configs

from ..loss_battery.dropins import (
    SAFE_MODULES_INCLUDE,
    SWAPPED_BY_RUNNER,
    drop_in_for,
)
from .context import DoctorContext, default_of
from .finding import Finding

#: Loss weights outside this range are reported.
LOSS_WEIGHT_RANGE = (0.1, 10.0)


def check_loss_weights(ctx: DoctorContext) -> List[Finding]:
    """A loss weight outside :data:`LOSS_WEIGHT_RANGE` (read off the
    built loss)."""
    low, high = LOSS_WEIGHT_RANGE
    findings = []
    for entry, loss in ctx.built_losses:
        weight = getattr(loss, 'loss_weight', None)
        if not isinstance(weight, (int, float)) or low <= weight <= high:
            continue
        clipped = min(max(weight, low), high)
        findings.append(
            Finding(
                'loss-weight-range',
                'warning',
                f'{type(loss).__name__} has loss_weight={weight:g}, outside '
                f'[{low:g}, {high:g}]: it dominates (or vanishes from) the '
                'gradient',
                f'{entry.path}.loss_weight={clipped:g}',
                entry.path,
            )
        )
    return findings


def _swapped_types(ctx: DoctorContext) -> set:
    """Types that ``nanguard.module_swaps`` (the include) replaces."""
    swaps = (ctx.cfg.get('nanguard') or {}).get('module_swaps') or []
    return {s.get('replace') for s in swaps if isinstance(s, dict)}


def check_fragile_modules(ctx: DoctorContext) -> List[Finding]:
    """Modules with a known NaN failure and a safe drop-in."""
    swapped = _swapped_types(ctx)
    found = []
    for path, cfg in iter_typed_configs(ctx.cfg.get('model') or {}):
        if cfg['type'] in swapped:
            continue
        cls = ctx.resolve(cfg['type'], MODELS) or ctx.resolve(
            cfg['type'], TASK_UTILS
        )
        safe = drop_in_for(cls) if isinstance(cls, type) else None
        if safe and safe not in SWAPPED_BY_RUNNER:
            found.append((path, cls.__name__, safe))
    if not found:
        return []
    listed = ', '.join(f'{p} ({c} -> {s})' for p, c, s in found)
    return [
        Finding(
            'fragile-modules',
            'warning',
            f'{len(found)} module(s) with a known NaN failure and a safe '
            f'drop-in: {listed}',
            f"_base_ = [..., '{SAFE_MODULES_INCLUDE}']",
            found[0][0],
        )
    ]


def _batchnorms(ctx: DoctorContext):
    """(path, eps) of every trained BatchNorm config (a module with
    ``norm_eval=True`` keeps its BN statistics frozen)."""
    frozen: List[str] = []
    for path, cfg in iter_typed_configs(ctx.cfg.get('model') or {}):
        if cfg.get('norm_eval') is True:
            frozen.append(path)
        if any(path.startswith(f'{f}.') for f in frozen):
            continue
        cls = ctx.resolve(cfg['type'], MODELS)
        if isinstance(cls, type) and issubclass(cls, _BatchNorm):
            yield path, cfg.get('eps', default_of(cls, 'eps', 1e-5))


def _built_batchnorms(ctx: DoctorContext) -> List[Tuple[str, float]]:
    """(module path, eps) of every BatchNorm of the built model that
    training updates (in train mode after ``model.train()``: a
    ``norm_eval=True`` backbone's are not), for models whose BatchNorm is
    a default of a class rather than written in the config."""
    model = ctx.built_model
    if model is None:
        return []
    return [
        (f'model.{name}', float(module.eps))
        for name, module in model.named_modules()
        if isinstance(module, _BatchNorm) and module.training
    ]


def check_batchnorm_eps(ctx: DoctorContext) -> List[Finding]:
    """BatchNorm with ``eps`` 1e-5 trained on a per-GPU batch of 1-2: the
    configs that set it, else the built model's modules."""
    if ctx.batch_size not in (1, 2):
        return []
    small = [(p, e) for p, e in _batchnorms(ctx) if e <= 1e-5]
    if not small:
        return _built_batchnorm_eps(ctx)
    paths = ', '.join(p for p, _ in small[:3])
    more = f' and {len(small) - 3} more' if len(small) > 3 else ''
    return [
        Finding(
            'batchnorm-small-batch',
            'warning',
            f'{len(small)} BatchNorm config(s) with eps={small[0][1]:g} '
            f'trained on {ctx.batch_size} image(s) per GPU ({paths}{more}): '
            'the batch variance of a flat feature map is ~0 and x / '
            'sqrt(var + eps) blows up',
            f"{small[0][0]}.eps=1e-3  # or type='GN', or SyncBN",
            small[0][0],
        )
    ]


def _built_batchnorm_eps(ctx: DoctorContext) -> List[Finding]:
    small = [(p, e) for p, e in _built_batchnorms(ctx) if e <= 1e-5]
    if not small:
        return []
    paths = ', '.join(p for p, _ in small[:3])
    more = f' and {len(small) - 3} more' if len(small) > 3 else ''
    # the component (backbone, neck, head) whose class takes norm_cfg
    owner = '.'.join(small[0][0].split('.')[:2])
    return [
        Finding(
            'batchnorm-small-batch',
            'warning',
            f'{len(small)} BatchNorm module(s) of the built model (a '
            'default of their class, no norm_cfg in the config) with '
            f'eps={small[0][1]:g} trained on {ctx.batch_size} image(s) per '
            f'GPU ({paths}{more}): the batch variance of a flat feature map '
            'is ~0 and x / sqrt(var + eps) blows up',
            f"{owner}.norm_cfg=dict(type='BN', eps=1e-3)  # or type='GN', "
            'or SyncBN',
            small[0][0],
        )
    ]
