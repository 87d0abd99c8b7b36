# Copyright (c) mmnanguard contributors. All rights reserved.
"""Shared checks for the guard's settings dataclasses."""

from dataclasses import fields
from typing import Any, Dict


def refuse_unknown_keys(cls: type, cfg: Dict[str, Any], label: str) -> None:
    """Raise a ``ValueError`` naming the keys of ``cfg`` that ``cls`` lacks.

    Args:
        cls (type): A dataclass.
        cfg (dict): The settings from a config.
        label (str): What the settings are called in the message, e.g.
            ``'setting'`` or ``'spike setting'``.
    """
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise ValueError(
            f'nanguard: unknown {label}(s) {unknown}; allowed {label}s '
            f'are {sorted(known)}'
        )
