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
#: Its counterpart for ``FlexibleRunner`` configs (its strategies).
FLEXIBLE_RUNNER_TYPE = 'mmnanguard.NanGuardFlexibleRunner'
_RUNNER_NAMES = (
    RUNNER_TYPE,
    'NanGuardRunner',
    FLEXIBLE_RUNNER_TYPE,
    'NanGuardFlexibleRunner',
)
#: The upstream runner types and their protected counterparts.
PROTECTED_COUNTERPART = {
    'Runner': RUNNER_TYPE,
    'mmengine.Runner': RUNNER_TYPE,
    'FlexibleRunner': FLEXIBLE_RUNNER_TYPE,
    'mmengine.FlexibleRunner': FLEXIBLE_RUNNER_TYPE,
}
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


def merge_settings(
    defaults: Dict[str, Any], given: Optional[Dict[str, Any]]
) -> Dict[str, Any]:
    """``given`` merged over ``defaults``, nested dicts key by key (the way
    mmengine merges a config over its bases), so that a
    ``--cfg-options nanguard.spike.action=skip`` keeps the other spike
    settings and every other key.

    Args:
        defaults (dict): The include's ``nanguard`` dict.
        given (dict, optional): What the config (or ``--cfg-options``) set.

    Returns:
        dict: A new dict.
    """
    merged = dict(defaults)
    for key, value in (given or {}).items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_settings(merged[key], value)
        else:
            merged[key] = value
    return merged


def protect_with_defaults(cfg: Config) -> None:
    """Select :class:`NanGuardRunner` (:class:`NanGuardFlexibleRunner` for
    a ``FlexibleRunner`` config) with the include's settings, keeping
    every ``nanguard`` option ``cfg`` already has (in place)."""
    named = PROTECTED_COUNTERPART.get(cfg.get('runner_type'))
    flexible = cfg.get('strategy') is not None or (
        named == FLEXIBLE_RUNNER_TYPE
    )
    cfg.runner_type = FLEXIBLE_RUNNER_TYPE if flexible else RUNNER_TYPE
    cfg.nanguard = merge_settings(
        default_protection(), _plain(cfg.get('nanguard'))
    )


def select_protected_runner(cfg: Config) -> Optional[str]:
    """Select the protected counterpart of the runner ``cfg`` builds
    (in place), when ``cfg`` has the include's ``nanguard`` key but not its
    runner: the config's own ``runner_type='FlexibleRunner'`` (or
    ``'Runner'``) replaced the include's (a config's own keys override its
    bases'), or the settings-only include (``nanguard_settings.py`` and
    its twins) came with another base's ``runner_type`` or with none.

    Args:
        cfg (Config): The training config.

    Returns:
        str | None: What was done, for the log; None: nothing to do.
    """
    runner_type = cfg.get('runner_type')
    if cfg.get('nanguard') is None:
        return None
    if runner_type is None:  # settings of the twin or --cfg-options
        protect_with_defaults(cfg)
        return (
            'the config has the nanguard settings and no runner_type; '
            f'{cfg.runner_type!r} is built'
        )
    counterpart = PROTECTED_COUNTERPART.get(runner_type)
    if counterpart is None:
        return None
    cfg.runner_type = counterpart
    return (
        f"runner_type={runner_type!r} replaced the include's runner; "
        f'{counterpart!r} (its protected counterpart) is built instead'
    )


def _plain(value: Any) -> Optional[Dict[str, Any]]:
    if value is None:
        return None
    if hasattr(value, 'to_dict'):
        return value.to_dict()
    return dict(value)


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
    if guard is not None and guard not in GUARD_CHOICES:
        raise ValueError(
            f'--guard {guard!r} is invalid; allowed values are '
            f'{GUARD_CHOICES}'
        )
    selected = select_protected_runner(cfg)
    if guard is None:
        if selected:
            return selected
        if uses_nanguard_runner(cfg):
            return 'protection as configured by the config'
        if has_guard_hook(cfg):
            return 'protection by the NanGuardHook in custom_hooks'
        if cfg.get('nanguard') is not None:  # settings no runner would use
            raise _no_counterpart(cfg, 'the nanguard settings')
        return 'no protection in the config (add --guard skip to turn it on)'
    if not uses_nanguard_runner(cfg):
        if guard == OFF:
            return 'no protection (--guard off)'
        if cfg.get('runner_type') not in (None, *PROTECTED_COUNTERPART):
            raise _no_counterpart(cfg, f'--guard {guard}')
        protect_with_defaults(cfg)
    nanguard = dict(cfg.get('nanguard') or {})
    nanguard['policy'] = guard
    cfg.nanguard = nanguard
    return f'--guard {guard}'


def has_guard_hook(cfg: Config) -> bool:
    """Whether ``custom_hooks`` adds a ``NanGuardHook`` by hand."""
    for hook in cfg.get('custom_hooks') or []:
        kind = hook.get('type') if hasattr(hook, 'get') else None
        name = kind if isinstance(kind, str) else getattr(kind, '__name__', '')
        if name.split('.')[-1] == 'NanGuardHook':
            return True
    return False


def _no_counterpart(cfg: Config, what: str) -> ValueError:
    return ValueError(
        f"{what}: the config sets runner_type={cfg.get('runner_type')!r}, "
        'a runner class mmnanguard has no protected counterpart of (it has '
        f'one of {sorted(PROTECTED_COUNTERPART)}), so nothing would be '
        'protected. Add NanGuardHook to custom_hooks instead.'
    )


def check_protection(cfg: Config) -> None:
    """Validate the ``nanguard`` key before anything is built.

    Raises:
        TypeError, ValueError: From :meth:`ProtectionSettings.from_dict`.
    """
    if uses_nanguard_runner(cfg):
        ProtectionSettings.from_dict(cfg.get('nanguard'))


def build_for_training(runner) -> None:
    """Build what ``Runner.train`` builds first: the train loop (with its
    dataloader and dataset) and the optim wrapper, so that a config that
    cannot train fails here, before anything is trained.

    ``Runner.train`` reuses both (mmengine's builders return a built object
    as it is). The param schedulers are left to it: they must be built
    after ``auto_scale_lr`` has scaled the learning rates.

    A ``FlexibleRunner``'s strategy builds the optim wrapper with the
    wrapped model, in ``train()``; a :class:`NanGuardFlexibleRunner` builds
    and protects its model first (its checks complete the dataloader).

    Args:
        runner: The built runner.
    """
    if not hasattr(runner, 'build_optim_wrapper'):  # a FlexibleRunner
        if hasattr(runner, 'build_protected_model'):
            runner.build_protected_model()
        runner.train_loop  # noqa: B018  (the property builds the loop)
        return
    if runner.train_loop is not None and runner.optim_wrapper is not None:
        runner.optim_wrapper = runner.build_optim_wrapper(runner.optim_wrapper)


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
    if not uses_nanguard_runner(cfg):
        protect_with_defaults(cfg)
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


def crash_fix(runner) -> Optional[str]:
    """The config fix for an exception that ended training, when the built
    model shows its cause; None otherwise (the exception is then a bug to
    see whole, with its traceback).

    The cause recognised is a head that feeds encoded deltas to a box loss
    (``reg_decoded_bbox=False``): mmrotate's ``GDLoss_v1(loss_type='kld')``
    then inverts a degenerate covariance and raises ``LinAlgError`` instead
    of returning a NaN that the guard would catch.

    Args:
        runner (Runner): The runner whose ``train()`` raised.

    Returns:
        str | None: The fix, in config syntax.
    """
    from mmengine.model import is_model_wrapper

    from mmnanguard.models.loss_kind import encoded_deltas_fix

    model = getattr(runner, 'model', None)
    if model is None:
        return None
    if is_model_wrapper(model):
        model = model.module
    try:
        return encoded_deltas_fix(model)
    except Exception:  # noqa: BLE001  (the crash's own error comes first)
        return None
