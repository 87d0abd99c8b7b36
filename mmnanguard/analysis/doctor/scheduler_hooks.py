# Copyright (c) mmnanguard contributors. All rights reserved.
"""Scheduler hooks that set the learning rate themselves (mmyolo's
``YOLOv5ParamSchedulerHook``, ``YOLOv8ParamSchedulerHook``, PPYOLOE's),
and whether they warm up.

Such a hook writes the lr of every parameter group each iteration from
its own cached base values, so it is where the warmup lives and a
``LinearLR`` in ``param_scheduler`` would only be overwritten.
"""

from typing import Any, Dict, List, NamedTuple

from mmengine.hooks import ParamSchedulerHook
from mmengine.registry import HOOKS

from mmnanguard.config_walk import build_in_scope

from .context import DoctorContext


class SchedulerHook(NamedTuple):
    """A hook that sets the lr itself.

    Args:
        path (str): Config path (``default_hooks.param_scheduler``).
        type (str): Its type as written.
        warmup (dict): Its warmup lengths (``warmup_epochs``,
            ``warmup_mim_iter``...) that are > 0; empty if it does not warm
            up, or where unknown.
        how (str): ``'built'`` (read off the built hook) or why it was read
            off the config as written.
        known (bool): Whether ``warmup`` is known.
    """

    path: str
    type: str
    warmup: Dict[str, Any]
    how: str
    known: bool = True


def _hook_configs(ctx: DoctorContext) -> List[tuple]:
    """(path, config) of ``default_hooks`` and ``custom_hooks``."""
    found = []
    for key, value in (ctx.cfg.get('default_hooks') or {}).items():
        if isinstance(value, dict) and 'type' in value:
            found.append((f'default_hooks.{key}', dict(value)))
    for i, value in enumerate(ctx.cfg.get('custom_hooks') or []):
        if isinstance(value, dict) and 'type' in value:
            found.append((f'custom_hooks[{i}]', dict(value)))
    return found


def _warmup_lengths(values: Dict[str, Any]) -> Dict[str, Any]:
    """The ``warmup*`` epochs/iterations among ``values`` that are > 0."""
    return {
        k: v
        for k, v in values.items()
        if k.startswith('warmup')
        and ('epoch' in k or 'iter' in k)
        and isinstance(v, (int, float))
        and not isinstance(v, bool)
        and v > 0
    }


def _sets_lr_itself(cls: type) -> bool:
    """A ``ParamSchedulerHook`` whose per-iteration step is its own (the
    stock one steps ``runner.param_schedulers``)."""
    return (
        issubclass(cls, ParamSchedulerHook)
        and cls.before_train_iter is not ParamSchedulerHook.before_train_iter
    )


def _as_written(path: str, cfg: Any, why: str) -> SchedulerHook:
    """The hook at ``path``, its warmup read off the config as written
    (``why``: why it is not read off the built hook)."""
    written = _warmup_lengths(cfg)
    return SchedulerHook(
        path,
        str(cfg['type']),
        written,
        f'read off the config as written: {why}',
        known=bool(written),
    )


def scheduler_hooks(ctx: DoctorContext) -> List[SchedulerHook]:
    """The hooks of the config that set the lr themselves.

    Each is built (in the config's scope) and its warmup read off the
    built object; a hook whose class is not registered here (its toolbox
    not importable) is read off the config as written, and its warmup is
    unknown where the config does not write it (the defaults are the
    class's).

    Args:
        ctx (DoctorContext): The config.

    Returns:
        list[SchedulerHook]: One per such hook (and per unknown one whose
        name says it schedules parameters).
    """
    found = []
    for path, cfg in _hook_configs(ctx):
        cls = ctx.resolve(cfg['type'], HOOKS)
        name = str(cfg['type'])
        if not isinstance(cls, type):
            if 'scheduler' not in name.lower():
                continue
            found.append(
                _as_written(
                    path,
                    cfg,
                    f'{name} is not registered here (its toolbox is not '
                    'importable)',
                )
            )
            continue
        if not _sets_lr_itself(cls):
            continue
        try:
            hook = build_in_scope(cfg, ctx.scope, HOOKS)
        except (TypeError, ValueError, KeyError, AssertionError) as err:
            found.append(
                _as_written(
                    path,
                    cfg,
                    f'building it failed ({type(err).__name__}: {err})',
                )
            )
            continue
        found.append(
            SchedulerHook(path, name, _warmup_lengths(vars(hook)), 'built')
        )
    return found
