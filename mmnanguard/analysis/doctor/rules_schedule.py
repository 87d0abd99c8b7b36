# Copyright (c) mmnanguard contributors. All rights reserved.
"""Rules on the learning rate: the linear-scaling rule for the total batch
size, and warmup."""

from typing import List, Optional

from mmengine.optim.scheduler import (
    ConstantParamScheduler,
    LinearParamScheduler,
)
from mmengine.registry import PARAM_SCHEDULERS

from .context import DoctorContext, default_of
from .finding import Finding

#: lr / linearly scaled lr above which the lr is "far above" the rule.
FAR_ABOVE = 2.0


def _schedulers(ctx: DoctorContext) -> list:
    """``param_scheduler`` as a list of scheduler configs."""
    value = ctx.cfg.get('param_scheduler') or []
    return [value] if isinstance(value, dict) else list(value)


def _warmup_scheduler(ctx: DoctorContext) -> Optional[dict]:
    """The first scheduler that starts at iteration/epoch 0 below the base
    lr and rises (a linear or constant factor < 1, or a class whose name
    says warmup)."""
    for sched in _schedulers(ctx):
        cls = ctx.resolve(sched.get('type'), PARAM_SCHEDULERS)
        if not isinstance(cls, type) or sched.get('begin', 0) != 0:
            continue
        if 'warmup' in cls.__name__.lower():
            return sched
        for base, key in (
            (LinearParamScheduler, 'start_factor'),
            (ConstantParamScheduler, 'factor'),
        ):
            if issubclass(cls, base):
                factor = sched.get(key, default_of(cls, key, 1.0))
                if factor < 1:
                    return sched
    return None


def _scaled_lr(ctx: DoctorContext):
    """(lr, total batch, base batch, auto-scaling on) or None."""
    lr = ctx.optimizer.get('lr')
    auto = ctx.cfg.get('auto_scale_lr') or {}
    base = auto.get('base_batch_size')
    if not isinstance(lr, (int, float)) or not base or not ctx.batch_size:
        return None
    return lr, ctx.batch_size * ctx.num_gpus, base, bool(auto.get('enable'))


def check_linear_scaling(ctx: DoctorContext) -> List[Finding]:
    """The lr far above the linear-scaling rule for the total batch size
    (``auto_scale_lr.base_batch_size`` is the batch the lr was set for)."""
    scaled = _scaled_lr(ctx)
    if scaled is None:
        return []
    lr, total, base, enabled = scaled
    if enabled or base / total <= FAR_ABOVE:
        return []
    rule_lr = lr * total / base
    return [
        Finding(
            'lr-above-linear-scaling',
            'warning',
            f'lr {lr:g} was set for a total batch of {base} '
            f'(auto_scale_lr.base_batch_size); this run has {total} '
            f'({ctx.num_gpus} GPU x {ctx.batch_size}), for which the '
            f'linear-scaling rule gives {rule_lr:.3g}: {base / total:.3g}x '
            'too high',
            f'auto_scale_lr = dict(enable=True, base_batch_size={base})  '
            f'# or optim_wrapper = dict(optimizer=dict(lr={rule_lr:.3g}))',
            'optim_wrapper.optimizer.lr',
        )
    ]


def check_warmup(ctx: DoctorContext) -> List[Finding]:
    """No warmup scheduler; an error when the lr is scaled up as well."""
    if ctx.cfg.get('optim_wrapper') is None or _warmup_scheduler(ctx):
        return []
    fix = (
        'param_scheduler = [dict(type="LinearLR", start_factor=0.001, '
        'by_epoch=False, begin=0, end=500), ...]  # before the others'
    )
    scaled = _scaled_lr(ctx)
    if scaled is not None and scaled[3] and scaled[1] > scaled[2]:
        lr, total, base, _ = scaled
        return [
            Finding(
                'lr-raised-without-warmup',
                'error',
                f'auto_scale_lr raises lr {lr:g} {total / base:.3g}x '
                f'(total batch {total} > base {base}) and no scheduler '
                'warms it up',
                fix,
                'param_scheduler',
            )
        ]
    names = [s.get('type') for s in _schedulers(ctx)] or 'none'
    return [
        Finding(
            'no-warmup',
            'warning',
            f'no warmup scheduler (param_scheduler: {names}); the first '
            'iterations run at the full lr',
            fix,
            'param_scheduler',
        )
    ]
