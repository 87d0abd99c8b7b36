# Copyright (c) mmnanguard contributors. All rights reserved.
"""Name the registered guarded counterpart of a configured optim wrapper."""

import copy
from typing import Any, Dict, List, Tuple

from ..optimizers import GUARDED_TYPES

#: Keys of an optim wrapper config that are not wrapper configs themselves.
_WRAPPER_KEYS = ('type', 'constructor', 'optimizer', 'paramwise_cfg')


def guarded_optim_wrapper_cfg(cfg: Dict[str, Any]) -> Tuple[Any, List[str]]:
    """A copy of ``cfg`` whose wrapper types are the guarded ones.

    ``OptimWrapper``, ``AmpOptimWrapper`` and ``CPUAmpOptimWrapper`` (with
    or without a scope prefix, and a missing ``type``, which mmengine reads
    as ``OptimWrapper``) become ``mmnanguard.Guarded*``; the members of an
    ``OptimWrapperDict`` config (a dict of wrapper configs) likewise. Any
    other type is left as it is: the hook guards it by a class swap.

    Args:
        cfg (dict): The ``optim_wrapper`` config.

    Returns:
        tuple: The new config and the types left as they were.
    """
    cfg = copy.deepcopy(cfg)
    if (
        'type' not in cfg
        and 'optimizer' not in cfg
        and cfg
        and all(isinstance(v, dict) for v in cfg.values())
    ):  # OptimWrapperDict: one wrapper config per key
        kept = []
        for name, member in cfg.items():
            cfg[name], more = guarded_optim_wrapper_cfg(member)
            kept += more
        return cfg, kept
    wrapper_type = cfg.get('type', 'OptimWrapper')
    if not isinstance(wrapper_type, str):
        return cfg, [getattr(wrapper_type, '__name__', str(wrapper_type))]
    bare = wrapper_type.split('.')[-1]
    if bare in GUARDED_TYPES:
        cfg['type'] = f'mmnanguard.{GUARDED_TYPES[bare]}'
        return cfg, []
    if bare in GUARDED_TYPES.values():
        return cfg, []
    return cfg, [wrapper_type]
