# Copyright (c) mmnanguard contributors. All rights reserved.
"""Mend: ``DeepSpeedStrategy`` cannot be built with a recent deepspeed
(mmengine <= 0.10.7).

``mmengine/_strategy/deepspeed.py`` (0.10.7) registers deepspeed's
optimizers when a ``DeepSpeedStrategy`` is built, importing
``FusedLamb`` from ``deepspeed.ops.lamb`` and ``OnebitAdam``,
``OnebitLamb``, ``ZeroOneAdam`` from ``deepspeed.runtime.fp16.onebit``.
deepspeed removed the 1-bit optimizers and ``FusedLamb`` (0.19.8 has
neither), so building the strategy fails with ``ImportError`` whatever the
config's optimizer is.

The mend replaces ``register_deepspeed_optimizers`` (looked up by name when
the strategy is built) by one that registers each of those optimizers the
installed deepspeed still has and names the ones it lacks. It does nothing
where deepspeed is absent or still has them all; it can go once mmengine
imports them one by one.
"""

import importlib
from typing import List, Tuple

from mmengine.logging import print_log

#: (module, class) of every optimizer mmengine 0.10.7 registers.
DEEPSPEED_OPTIMIZERS: Tuple[Tuple[str, str], ...] = (
    ('deepspeed.ops.adam', 'DeepSpeedCPUAdam'),
    ('deepspeed.ops.adam', 'FusedAdam'),
    ('deepspeed.ops.lamb', 'FusedLamb'),
    ('deepspeed.runtime.fp16.onebit', 'OnebitAdam'),
    ('deepspeed.runtime.fp16.onebit', 'OnebitLamb'),
    ('deepspeed.runtime.fp16.onebit', 'ZeroOneAdam'),
)


def _available() -> Tuple[List[type], List[str]]:
    """The optimizer classes the installed deepspeed has, and the names of
    those it lacks."""
    found, missing = [], []
    for module, name in DEEPSPEED_OPTIMIZERS:
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            missing.append(f'{module}.{name}')
    return found, missing


def register_deepspeed_optimizers() -> List[str]:
    """Register deepspeed's optimizers that the installed deepspeed has in
    mmengine's ``OPTIMIZERS`` (the mended upstream function).

    Returns:
        list[str]: The names registered.
    """
    from mmengine.registry import OPTIMIZERS

    found, missing = _available()
    names = []
    for cls in found:
        if cls.__name__ not in OPTIMIZERS.module_dict:
            OPTIMIZERS.register_module(module=cls)
        names.append(cls.__name__)
    if missing:
        print_log(
            f'nanguard: the installed deepspeed lacks {missing}; '
            'DeepSpeedStrategy registers the other deepspeed optimizers',
            logger='current',
        )
    return names


def is_needed() -> bool:
    """Whether mmengine imports deepspeed and this deepspeed lacks one of
    the optimizers mmengine's registration imports."""
    try:
        from mmengine._strategy import deepspeed as strategy
    except ImportError:
        return False
    if getattr(strategy, 'deepspeed', None) is None:
        return False
    return bool(_available()[1])


def apply() -> bool:
    """Apply the mend where needed.

    Returns:
        bool: Whether the registration was replaced.
    """
    if not is_needed():
        return False
    from mmengine._strategy import deepspeed as strategy

    strategy.register_deepspeed_optimizers = register_deepspeed_optimizers
    return True
