# Copyright (c) mmnanguard contributors. All rights reserved.
"""Config edits behind ``tools/train.py``'s ``--guard``, ``--smoke-test`` and
``--amp`` flags, kept here so that the script only maps flags onto them."""

import math
import os.path as osp
from typing import Any, Dict, List, Optional, Tuple

import torch
from mmengine.config import Config

from .protection import OFF, ProtectionSettings

#: The runner type that the include sets and ``--guard`` selects.
RUNNER_TYPE = 'mmnanguard.NanGuardRunner'
_RUNNER_NAMES = (RUNNER_TYPE, 'NanGuardRunner')
GUARD_CHOICES = ('raise', 'skip', 'rollback', OFF)


def config_root() -> str:
    """``configs/`` as shipped: ``mmnanguard/.mim/configs`` when installed,
    else the source tree's ``configs``."""
    here = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
    shipped = osp.join(here, '.mim', 'configs')
    if osp.isdir(shipped):
        return shipped
    return osp.join(osp.dirname(here), 'configs')


def default_protection() -> Dict[str, Any]:
    """The ``nanguard`` dict of ``configs/_base_/nanguard.py``."""
    path = osp.join(config_root(), '_base_', 'nanguard.py')
    return Config.fromfile(path).to_dict()['nanguard']


def uses_nanguard_runner(cfg: Config) -> bool:
    """Whether ``cfg`` selects :class:`NanGuardRunner`."""
    return cfg.get('runner_type') in _RUNNER_NAMES


def apply_guard_option(cfg: Config, guard: Optional[str]) -> str:
    """Apply ``--guard`` to ``cfg`` in place.

    Args:
        cfg (Config): The training config.
        guard (str, optional): ``'raise'``, ``'skip'``, ``'rollback'``,
            ``'off'`` or None (leave the config as it is).

    Returns:
        str: What was done, for the log.

    Raises:
        ValueError: ``guard`` is not a choice, or the config selects a
            different runner type (which the guard cannot wrap).
    """
    if guard is None:
        if uses_nanguard_runner(cfg):
            return 'protection as configured by the config'
        return 'no protection in the config (add --guard skip to turn it on)'
    if guard not in GUARD_CHOICES:
        raise ValueError(
            f'--guard {guard!r} is invalid; allowed values are '
            f'{GUARD_CHOICES}'
        )
    if not uses_nanguard_runner(cfg):
        if guard == OFF:
            return 'no protection (--guard off)'
        if cfg.get('runner_type') is not None:
            raise ValueError(
                f'--guard {guard}: the config sets runner_type='
                f"{cfg.runner_type!r}; mmnanguard's protection needs "
                f'runner_type={RUNNER_TYPE!r}. Add NanGuardHook to '
                'custom_hooks instead.'
            )
        cfg.runner_type = RUNNER_TYPE
        cfg.nanguard = default_protection()
    nanguard = dict(cfg.get('nanguard') or {})
    nanguard['policy'] = guard
    cfg.nanguard = nanguard
    return f'--guard {guard}'


def check_protection(cfg: Config) -> None:
    """Validate the ``nanguard`` key before anything is built.

    Raises:
        TypeError, ValueError: From :meth:`ProtectionSettings.from_dict`.
    """
    if uses_nanguard_runner(cfg):
        ProtectionSettings.from_dict(cfg.get('nanguard'))


def apply_amp_option(cfg: Config) -> str:
    """``--amp``: ``AmpOptimWrapper``, or ``CPUAmpOptimWrapper`` (fp16 CPU
    autocast with the CPU GradScaler) where no GPU is available.

    Returns:
        str: What was done, for the log.

    Raises:
        ValueError: The optim wrapper is neither ``OptimWrapper`` nor AMP.
    """
    current = cfg.optim_wrapper.get('type', 'OptimWrapper')
    if 'Amp' in current:
        return f'AMP already enabled in the config ({current})'
    if current != 'OptimWrapper':
        raise ValueError(
            f'--amp needs optim_wrapper.type=OptimWrapper, the '
            f'config has {current!r}'
        )
    wanted = (
        'AmpOptimWrapper'
        if torch.cuda.is_available()
        else 'CPUAmpOptimWrapper'
    )
    cfg.optim_wrapper.type = wanted
    cfg.optim_wrapper.loss_scale = 'dynamic'
    return f'--amp: optim_wrapper.type={wanted}'


def apply_smoke_test(cfg: Config, iters: int) -> None:
    """``--smoke-test N``: N iterations, fixed seed, no validation, no
    checkpoints; the guard skips (never escalating by count) so that every
    iteration is recorded, and raises where a skip cannot help.

    Args:
        cfg (Config): The training config, changed in place.
        iters (int): Number of iterations (>= 1).
    """
    cfg.train_cfg = dict(
        type='IterBasedTrainLoop', max_iters=iters, val_interval=10**9
    )
    for key in ('val_cfg', 'val_dataloader', 'val_evaluator'):
        cfg[key] = None
    cfg.default_hooks = cfg.get('default_hooks') or {}
    cfg.default_hooks['checkpoint'] = None
    seed = (cfg.get('randomness') or {}).get('seed')
    cfg.randomness = dict(seed=0 if seed is None else seed)
    if cfg.get('log_processor') is not None:
        cfg.log_processor.by_epoch = False
    if (
        not uses_nanguard_runner(cfg)
        or (cfg.get('nanguard') or {}).get('policy') == OFF
    ):
        cfg.runner_type = RUNNER_TYPE
        cfg.nanguard = default_protection()
    nanguard = dict(cfg.nanguard)
    nanguard.update(
        policy='skip',
        escalate_to='raise',
        max_consecutive_skips=iters + 1,
        history_size=max(iters, nanguard.get('history_size', 50)),
    )
    cfg.nanguard = nanguard


def _finite(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, str):  # the history keeps 'nan'/'inf' as text
        return False
    return math.isfinite(float(value))


def smoke_test_rows(runner) -> Tuple[List[str], bool]:
    """Per-iteration lines (loss terms, grad norm) of a smoke test.

    Args:
        runner: The trained :class:`NanGuardRunner`.

    Returns:
        tuple: The lines, and whether every value was finite and no
        incident occurred.
    """
    from ..hooks import NanGuardHook

    guard = next(h for h in runner.hooks if isinstance(h, NanGuardHook))
    lines, ok = [], guard.counters['incidents'] == 0
    for row in guard.history.to_list():
        values = dict(row['loss_terms'], grad_norm=row['grad_norm'])
        bad = [k for k, v in values.items() if not _finite(v)]
        ok = ok and not bad
        text = '  '.join(
            f'{k}={v:.4g}' if isinstance(v, float) else f'{k}={v}'
            for k, v in values.items()
        )
        flag = f'  NON-FINITE: {bad}' if bad else ''
        lines.append(f"iter {row['iteration'] + 1}: {text}{flag}")
    return lines, ok
