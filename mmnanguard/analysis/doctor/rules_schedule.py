# Copyright (c) mmnanguard contributors. All rights reserved.
"""Rules on the learning rate: the linear-scaling rule for the total batch
size, and warmup."""

import math
from typing import List, Optional

from mmengine.optim.scheduler import (
    ConstantParamScheduler,
    LinearParamScheduler,
)
from mmengine.registry import PARAM_SCHEDULERS

from .context import DoctorContext, default_of
from .finding import Finding
from .lr_provenance import lr_reference
from .scheduler_hooks import SchedulerHook, scheduler_hooks

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


def _assumed(ctx: DoctorContext) -> List[Finding]:
    """What the rule assumed for a config without ``base_batch_size``."""
    lr = ctx.optimizer.get('lr')
    if not isinstance(lr, (int, float)) or not ctx.batch_size:
        return []
    total = ctx.batch_size * ctx.num_gpus
    return [
        Finding(
            'lr-scaling-assumed',
            'info',
            f'no auto_scale_lr.base_batch_size: lr {lr:g} is assumed to be '
            f"set for this run's total batch of {total} ({ctx.num_gpus} "
            f'GPU x {ctx.batch_size}); the linear-scaling rule was not '
            'checked',
            f'auto_scale_lr = dict(base_batch_size={total})  # the batch '
            'lr was tuned for',
            'auto_scale_lr.base_batch_size',
        )
    ]


def _scaled_by_hand(ctx: DoctorContext, lr: float, total: int, base: int):
    """Whether ``lr`` is the lr that ``base_batch_size`` was written for
    (:func:`.lr_provenance.lr_reference`), scaled by hand to this run's
    total batch by the linear-scaling rule."""
    ref = lr_reference(ctx.cfg)
    if ref is None or ref.lr == lr or not ref.lr:
        return False
    return math.isclose(lr / ref.lr, total / base, rel_tol=1e-3)


def check_linear_scaling(ctx: DoctorContext) -> List[Finding]:
    """The lr far above the linear-scaling rule for the total batch size.

    ``auto_scale_lr.base_batch_size`` is the batch the lr was set for; an
    lr that a config changed after the file setting ``base_batch_size``,
    to exactly that file's lr scaled to this run's batch, was scaled by
    hand and passes (:func:`_scaled_by_hand`). Without
    ``base_batch_size`` the finding says what was assumed.
    """
    scaled = _scaled_lr(ctx)
    if scaled is None:
        return _assumed(ctx) if ctx.optim_wrapper else []
    lr, total, base, enabled = scaled
    if enabled or base / total <= FAR_ABOVE:
        return []
    if _scaled_by_hand(ctx, lr, total, base):
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


def _hook_findings(hooks: List[SchedulerHook]) -> List[Finding]:
    """Findings on the warmup of hooks that set the lr themselves; none
    where one warms up."""
    warming = [h for h in hooks if h.known and h.warmup]
    if warming:
        hook = warming[0]
        lengths = ', '.join(f'{k}={v:g}' for k, v in hook.warmup.items())
        how = 'the built hook' if hook.how == 'built' else 'the config'
        return [
            Finding(
                'warmup-in-hook',
                'info',
                f'the lr warms up in {hook.path} ({hook.type}: {lengths}, '
                f'read off {how}), which sets the lr itself; no '
                'param_scheduler warmup is needed (it would be overwritten)',
                'nothing to change',
                hook.path,
            )
        ]
    findings = []
    for hook in hooks:
        if not hook.known:
            findings.append(
                Finding(
                    'warmup-unknown',
                    'info',
                    f'{hook.path} ({hook.type}) sets the lr itself; whether '
                    f'it warms up is unknown ({hook.how}), so no '
                    'param_scheduler warmup is proposed (the hook would '
                    'overwrite it)',
                    f'{hook.path}.warmup_epochs=3  # if it takes one',
                    hook.path,
                )
            )
        else:
            findings.append(
                Finding(
                    'no-warmup',
                    'warning',
                    f'{hook.path} ({hook.type}) sets the lr itself and does '
                    f'not warm up ({hook.how}); a LinearLR in '
                    'param_scheduler would be overwritten by it',
                    f"{hook.path}.warmup_epochs=3  # the hook's own warmup",
                    hook.path,
                )
            )
    return findings


def check_warmup(ctx: DoctorContext) -> List[Finding]:
    """No warmup, in ``param_scheduler`` or in a scheduler hook that sets
    the lr itself (read off the built hook, see
    :mod:`.scheduler_hooks`); an error when the lr is scaled up as well."""
    if ctx.cfg.get('optim_wrapper') is None or _warmup_scheduler(ctx):
        return []
    hooks = scheduler_hooks(ctx)
    if hooks:
        return _hook_findings(hooks)
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
