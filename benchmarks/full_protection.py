# Copyright (c) mmnanguard contributors. All rights reserved.
"""Add mmnanguard's protection beyond the guard to a loaded config.

A benchmark helper, not part of the package: the benchmarks
(``benchmarks/overhead.py --modes guard_full``,
``benchmarks/fault_matrix.py``) compare the guard alone with the guard plus
the other protection pieces. This module adds those pieces to a
``Config`` in place, each only when it is registered, and says what it
added and what it could not add, so that a benchmark never reports a mode
that silently lacks a piece. The scripts import it as a sibling module
(``from full_protection import add_full_protection``; ``benchmarks/`` is
on ``sys.path`` as the running script's folder).
"""

import logging
from typing import Any, Dict, List, Optional, Tuple

from mmengine.logging import print_log

from mmnanguard.registry import HOOKS, TRANSFORMS

#: The protection pieces this module adds, by registered name.
AMP_MONITOR = 'AmpScaleMonitorHook'
VALIDATE = 'ValidateAnnotations'


def _registered(registry, name: str) -> bool:
    return registry.get(name) is not None


def add_full_protection(
    cfg: Any,
    validate_policy: str = 'warn',
    amp_monitor: Optional[Dict[str, Any]] = None,
) -> List[str]:
    """Add ``AmpScaleMonitorHook`` and ``ValidateAnnotations`` to ``cfg``.

    The ``NanGuardHook`` itself is not added: the caller chooses its policy.

    * ``AmpScaleMonitorHook`` is appended to ``custom_hooks``. With an
      optim wrapper that is not an ``AmpOptimWrapper`` it only logs once,
      at ``before_train``, that it has nothing to monitor.
    * ``ValidateAnnotations`` is inserted into every training pipeline
      right before its ``Pack*Inputs`` transform, i.e. after the box
      conversion and every augmentation, with ``num_classes``,
      ``angle_version`` and ``ignore_index`` read off the model config (the
      rewrite :class:`NanGuardRunner` applies for
      ``nanguard.validate_annotations``).

    Args:
        cfg (Config): A loaded config, e.g. from ``load_tiny_config``;
            changed in place.
        validate_policy (str): ``ValidateAnnotations`` policy: ``'warn'``
            (the default of ``configs/_base_/nanguard.py``), ``'filter'``
            or ``'raise'``.
        amp_monitor (dict, optional): ``AmpScaleMonitorHook`` arguments.
            Defaults to the hook's defaults.

    Returns:
        list[str]: One line per piece: what was added, or why it was not
        (not registered yet, no training pipeline).

    Raises:
        ValueError: ``num_classes`` cannot be read off the model config
            (from ``infer_validate_settings``).
    """
    from mmnanguard.engine.runner.config_rewrites import (
        infer_validate_settings,
        insert_validate_annotations,
    )

    notes: List[Tuple[int, str]] = []
    if _registered(HOOKS, AMP_MONITOR):
        hooks = list(cfg.get('custom_hooks') or [])
        hooks.append(dict(type=AMP_MONITOR, **(amp_monitor or {})))
        cfg.custom_hooks = hooks
        notes.append((logging.INFO, f'{AMP_MONITOR} added to custom_hooks'))
    else:
        notes.append(
            (logging.WARNING, f'{AMP_MONITOR} not added: not registered')
        )
    if not _registered(TRANSFORMS, VALIDATE):
        notes.append(
            (logging.WARNING, f'{VALIDATE} not inserted: not registered')
        )
    else:
        transform = infer_validate_settings(cfg, dict(policy=validate_policy))
        changed, why_not = insert_validate_annotations(
            cfg.train_dataloader, transform
        )
        if changed:
            notes.append(
                (
                    logging.INFO,
                    f'{transform} inserted before Pack*Inputs in '
                    f'{changed} training pipeline(s)',
                )
            )
        else:
            notes.append(
                (logging.WARNING, f'{VALIDATE} not inserted: {why_not}')
            )
    for level, note in notes:
        print_log(
            f'add_full_protection: {note}', logger='current', level=level
        )
    return [note for _, note in notes]
