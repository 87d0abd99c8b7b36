# Copyright (c) mmnanguard contributors. All rights reserved.
"""Rules on the optimizer: SGD without gradient clipping, and AMP with a
static loss scale, a small Adam ``eps`` or a loss with no fp32 island."""

from typing import List

import torch

from ..loss_battery import battery_cases, drop_in_for, infer_kind
from .context import DoctorContext, default_of
from .finding import Finding


def check_sgd_clip_grad(ctx: DoctorContext) -> List[Finding]:
    """SGD without ``clip_grad``."""
    cls = ctx.optimizer_class
    if not (isinstance(cls, type) and issubclass(cls, torch.optim.SGD)):
        return []
    if ctx.optim_wrapper.get('clip_grad'):
        return []
    return [
        Finding(
            'sgd-without-clip-grad',
            'warning',
            f'{cls.__name__} without gradient clipping: one exploding '
            'batch moves every weight',
            'optim_wrapper = dict(clip_grad=dict(max_norm=35, norm_type=2))',
            'optim_wrapper.clip_grad',
        )
    ]


def check_amp_loss_scale(ctx: DoctorContext) -> List[Finding]:
    """AMP with a static ``loss_scale``."""
    scale = ctx.optim_wrapper.get('loss_scale', 'dynamic')
    if not ctx.is_amp or not isinstance(scale, (int, float)):
        return []
    return [
        Finding(
            'amp-static-loss-scale',
            'warning',
            f'AMP with a static loss_scale={scale:g}: the scale never '
            'backs off, so an fp16 overflow recurs every step (each one '
            'skipped) and gradients below 2^-24/scale vanish',
            "optim_wrapper = dict(loss_scale='dynamic')",
            'optim_wrapper.loss_scale',
        )
    ]


def check_amp_adam_eps(ctx: DoctorContext) -> List[Finding]:
    """AMP with Adam/AdamW ``eps`` <= 1e-8."""
    cls = ctx.optimizer_class
    adam = (torch.optim.Adam, torch.optim.AdamW)
    if not ctx.is_amp or not (isinstance(cls, type) and issubclass(cls, adam)):
        return []
    eps = ctx.optimizer.get('eps', default_of(cls, 'eps', 1e-8))
    if eps > 1e-8:
        return []
    return [
        Finding(
            'amp-adam-eps',
            'warning',
            f'AMP with {cls.__name__} eps={eps:g}: with fp16-scale '
            'gradients the update g / (sqrt(v) + eps) explodes where v '
            'underflows',
            'optim_wrapper = dict(optimizer=dict(eps=1e-6))',
            'optim_wrapper.optimizer.eps',
        )
    ]


def _computes_in_fp16(loss: torch.nn.Module, kind: str) -> bool:
    """Whether the loss returns fp16 for fp16 inputs under CPU autocast
    (no fp32 island), on its nominal battery case."""
    case = battery_cases(loss, kind)[0]
    args, kwargs = case.make()
    args = [
        a.detach().half()
        if torch.is_tensor(a) and a.is_floating_point()
        else a
        for a in args
    ]
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.float16):
        out = loss(*args, **kwargs)
    out = out if torch.is_tensor(out) else next(iter(out.values()))
    return out.dtype == torch.float16


def check_amp_fp32_island(ctx: DoctorContext) -> List[Finding]:
    """AMP with a loss that computes in fp16 (no fp32 island)."""
    if not ctx.is_amp:
        return []
    findings = []
    for entry, loss in ctx.built_losses:
        if loss is None:
            continue
        try:
            fp16 = _computes_in_fp16(loss, infer_kind(loss, ctx.scope))
        except (ValueError, TypeError, RuntimeError) as err:
            findings.append(
                Finding(
                    'amp-loss-without-fp32-island',
                    'info',
                    f'{type(loss).__name__}: could not run it in fp16 to '
                    f'look for an fp32 island: {type(err).__name__}: {err}',
                    f'python tools/check_loss.py CONFIG  # {entry.path}',
                    entry.path,
                )
            )
            continue
        if not fp16:
            continue
        safe = drop_in_for(type(loss))
        fix = (
            f"{entry.path}.type='{safe}'"
            if safe
            else "optim_wrapper = dict(dtype='bfloat16')  # fp32 range"
        )
        findings.append(
            Finding(
                'amp-loss-without-fp32-island',
                'warning',
                f'{type(loss).__name__} computes in fp16 under AMP (no fp32 '
                'island): log/exp/sums overflow or underflow at 65504',
                fix,
                entry.path,
            )
        )
    return findings
