# Copyright (c) mmnanguard contributors. All rights reserved.
"""Rules on the learning rate: the scaling rule of the optimizer's family
for the total batch size, and warmup."""

import math
from typing import List, Optional

from mmengine.optim.scheduler import (
    ConstantParamScheduler,
    LinearParamScheduler,
)
from mmengine.registry import PARAM_SCHEDULERS

from .context import DoctorContext, default_of
from .finding import Finding
from .lr_provenance import WrittenLr, written_lrs
from .lr_scaling_rules import OptimizerFamily, ScalingRule, optimizer_family
from .scheduler_hooks import SchedulerHook, scheduler_hooks

#: lr / the lr of the scaling rule above which the lr is "far above" it.
FAR_ABOVE = 2.0
#: Relative tolerance of an lr scaled by hand (rounded when written).
HAND_SCALED_TOLERANCE = 0.02


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
            f'GPU x {ctx.batch_size}); the lr scaling rule was not checked',
            f'auto_scale_lr = dict(base_batch_size={total})  # the batch '
            'lr was tuned for',
            'auto_scale_lr.base_batch_size',
        )
    ]


def _batch(ctx: DoctorContext, total: int) -> str:
    return f'total batch of {total} ({ctx.num_gpus} GPU x {ctx.batch_size})'


def _scaled_by_hand(
    ctx: DoctorContext, written: List[WrittenLr], family: OptimizerFamily
) -> Optional[Finding]:
    """An info finding when the lr is one that a file of the chain writes
    for ``base_batch_size`` (:func:`.lr_provenance.written_lrs`), scaled
    to this run's batch by one of the family's rules; None otherwise."""
    lr, total, base, _ = _scaled_lr(ctx)
    for source in written:
        for rule in family.rules:
            factor = rule.factor(total, base)
            if factor == 1.0 or not math.isclose(
                lr, source.lr * factor, rel_tol=HAND_SCALED_TOLERANCE
            ):
                continue
            return Finding(
                'lr-scaling-rule',
                'info',
                f'lr {lr:g} is {source.lr:g} ({source.source}, for '
                f'auto_scale_lr.base_batch_size={base}) scaled by hand to '
                f"this run's {_batch(ctx, total)} by the "
                f'{rule.describe(total, base)} for {family.name}',
                'nothing to change',
                'optim_wrapper.optimizer.lr',
            )
    return None


def _unknown_family(ctx: DoctorContext) -> List[Finding]:
    """The info finding for an optimizer with no known scaling rule."""
    lr, total, base, _ = _scaled_lr(ctx)
    optimizer = ctx.built_optimizer
    what = (
        type(optimizer).__name__
        if optimizer is not None
        else f'{ctx.optimizer.get("type")!r}, which does not build '
        f'({ctx.optimizer_error})'
    )
    return [
        Finding(
            'lr-scaling-unknown',
            'info',
            f'no lr scaling rule is known for {what}: lr {lr:g} was not '
            f'checked against the total batch of {base} it was set for '
            f"(auto_scale_lr.base_batch_size) and this run's "
            f'{_batch(ctx, total)}',
            'optim_wrapper = dict(optimizer=dict(lr=...))  # if the lr '
            'depends on the batch',
            'optim_wrapper.optimizer.lr',
        )
    ]


def check_lr_scaling(ctx: DoctorContext) -> List[Finding]:
    """The lr far above the scaling rule of the optimizer's family for the
    total batch size (:mod:`.lr_scaling_rules`: linear for SGD; square
    root or none for Adam and AdamW; none for Adadelta and Adagrad; the
    family read off the built optimizer).

    ``auto_scale_lr.base_batch_size`` is the batch the lr was set for. An
    lr that a file of the config's chain writes for that batch, scaled by
    hand to this run's batch by an accepted rule, passes with an info line
    naming the rule (:func:`_scaled_by_hand`). Otherwise the lr the rule
    starts from is the run's lr when a file writes it, else (set by
    ``--cfg-options`` or in code) the lr of the most derived file, and the
    most lenient accepted rule is checked. Without ``base_batch_size``, or
    for an optimizer with no known rule, an info line says what was not
    checked.
    """
    scaled = _scaled_lr(ctx)
    if scaled is None:
        return _assumed(ctx) if ctx.optim_wrapper else []
    lr, total, base, enabled = scaled
    if enabled or total == base:
        return []
    optimizer = ctx.built_optimizer
    family = optimizer_family(optimizer) if optimizer is not None else None
    if family is None:
        return _unknown_family(ctx)
    written = written_lrs(ctx.cfg)
    by_hand = _scaled_by_hand(ctx, written, family)
    if by_hand is not None:
        return [by_hand]
    in_a_file = not written or any(w.lr == lr for w in written)
    start = lr if in_a_file else written[0].lr
    rule = max(family.rules, key=lambda r: r.factor(total, base))
    rule_lr = start * rule.factor(total, base)
    setting = (
        f'lr {lr:g} was set'
        if in_a_file
        else f'lr {lr:g} is not in the config files, whose lr '
        f'{start:g} ({written[0].source}) was set'
    )
    if lr / rule_lr > FAR_ABOVE:
        return [
            Finding(
                'lr-above-linear-scaling',
                'warning',
                f'{setting} for a total batch of {base} '
                f"(auto_scale_lr.base_batch_size); this run's "
                f'{_batch(ctx, total)} takes {rule_lr:.3g} by the '
                f'{rule.describe(total, base)} for {family.name}: '
                f'{lr / rule_lr:.3g}x too high',
                f'auto_scale_lr = dict(enable=True, base_batch_size={base})'
                f'  # or optim_wrapper = dict(optimizer=dict(lr='
                f'{rule_lr:.3g}))',
                'optim_wrapper.optimizer.lr',
            )
        ]
    if rule is not ScalingRule.NONE or not in_a_file:
        return []
    return [
        Finding(
            'lr-scaling-rule',
            'info',
            f'{setting} for a total batch of {base} '
            "(auto_scale_lr.base_batch_size) and is kept for this run's "
            f'{_batch(ctx, total)} by the {rule.describe(total, base)} '
            f'for {family.name}',
            'nothing to change',
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
