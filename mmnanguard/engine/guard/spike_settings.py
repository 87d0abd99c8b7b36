# Copyright (c) mmnanguard contributors. All rights reserved.
"""Validated settings of the loss-spike detector (``spike=dict(...)``)."""

import math
from dataclasses import asdict, dataclass
from typing import Any, Dict, Optional, Sequence

from .config_checks import refuse_unknown_keys

SPIKE_ACTIONS = ('log', 'skip', 'rollback')


@dataclass
class SpikeSettings:
    """How :class:`NanGuardHook` detects and handles loss spikes.

    A value is a spike when it exceeds ``factor`` times the largest of the
    last ``window`` accepted values of the same quantity (see
    :class:`~mmnanguard.engine.guard.spike_detector.SpikeDetector`).

    Args:
        action (str): ``'log'`` records the spike (counter, log line, the
            history ring buffer) and never touches the update; ``'skip'``
            drops the update and multiplies the learning rates by the
            guard's ``lr_backoff`` (unless ``backoff=False``);
            ``'rollback'`` drops the update and rolls back like a
            non-finite incident (which backs off the learning rates).
            ``'skip'`` escalates like the guard's ``'skip'`` policy after
            ``max_consecutive_skips``. Defaults to ``'log'`` (the value
            ``configs/_base_/nanguard_settings.py`` sets).
        factor (float): Spike threshold, a multiple (> 1) of the running
            max. Defaults to 10.0.
        window (int): Accepted values kept per quantity. Defaults to 50.
        warmup (int): Values a quantity must have accumulated before it is
            checked (``1 <= warmup <= window``). Defaults to 10.
        keys (list[str], optional): Loss terms to check, by their
            ``parse_losses`` name (``'loss'`` is the total). None checks the
            total and every term whose name contains ``'loss'``. Defaults
            to None.
        grad_norm (bool): Check the global gradient norm too (not under
            ``AmpOptimWrapper``, whose GradScaler owns the gradients).
            Defaults to True.
        min_value (float): Floor of the running max a value is compared
            with: a quantity whose recent values are all below it needs
            ``value > factor * min_value`` to count as a spike. With 0, a
            quantity whose running max is 0 is not checked. Defaults to 0.
        backoff (bool): Whether ``action='skip'`` multiplies the learning
            rates by ``lr_backoff``. Defaults to True.

    Example:
        >>> custom_hooks = [dict(type='NanGuardHook', lr_backoff=0.5,
        ...                      recover_iters=100,
        ...                      spike=dict(action='skip', factor=10.0))]
    """

    action: str = 'log'
    factor: float = 10.0
    window: int = 50
    warmup: int = 10
    keys: Optional[Sequence[str]] = None
    grad_norm: bool = True
    min_value: float = 0.0
    backoff: bool = True

    def __post_init__(self) -> None:
        if self.action not in SPIKE_ACTIONS:
            raise ValueError(
                f'nanguard: spike.action={self.action!r} is '
                f'invalid; allowed values are {SPIKE_ACTIONS}'
            )
        if not _is_number(self.factor) or not 1 < self.factor < math.inf:
            raise ValueError(
                f'nanguard: spike.factor={self.factor!r} is '
                'invalid; expected a finite number > 1, e.g. '
                '10.0'
            )
        for name in ('window', 'warmup'):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or value < 1
            ):
                raise ValueError(
                    f'nanguard: spike.{name}={value!r} is '
                    'invalid; expected an integer >= 1'
                )
        if self.warmup > self.window:
            raise ValueError(
                f'nanguard: spike.warmup={self.warmup!r} is '
                f'invalid; expected <= spike.window='
                f'{self.window}'
            )
        if (
            not _is_number(self.min_value)
            or not 0 <= self.min_value < math.inf
        ):
            raise ValueError(
                f'nanguard: spike.min_value={self.min_value!r} '
                'is invalid; expected a finite number >= 0'
            )
        if self.keys is not None and (
            isinstance(self.keys, str)
            or not all(isinstance(k, str) for k in self.keys)
        ):
            raise TypeError(
                f'nanguard: spike.keys={self.keys!r} is '
                'invalid; expected None or a list of loss term '
                "names, e.g. ['loss', 'loss_cls']"
            )
        for name in ('grad_norm', 'backoff'):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(
                    f'nanguard: spike.{name}='
                    f'{getattr(self, name)!r} is invalid; '
                    'expected True or False'
                )
        if self.keys is not None:
            self.keys = list(self.keys)

    @classmethod
    def from_dict(cls, cfg: Any) -> 'SpikeSettings':
        """Build from ``spike=dict(...)``, refusing unknown keys by name."""
        if isinstance(cfg, cls):
            return cfg
        if not isinstance(cfg, dict):
            raise TypeError(
                f'nanguard: spike={cfg!r} is invalid; expected '
                "None or a dict, e.g. dict(action='skip')"
            )
        refuse_unknown_keys(cls, cfg, 'spike setting')
        return cls(**cfg)

    def to_dict(self) -> Dict[str, Any]:
        """The settings as a plain dict."""
        return asdict(self)


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float))
