# Copyright (c) mmnanguard contributors. All rights reserved.
"""Validated settings of the guard, shared by its hook and runner."""

from dataclasses import asdict, dataclass
from typing import Any, Dict, Optional

from .config_checks import refuse_unknown_keys
from .spike_settings import SpikeSettings

POLICIES = ('raise', 'skip', 'rollback')
ESCALATIONS = ('rollback', 'raise')
ROLLBACK_SOURCES = ('memory', 'checkpoint')


@dataclass
class GuardSettings:
    """What the guard does when a non-finite value appears.

    Args:
        policy (str): ``'raise'`` stops training with
            :class:`NonFiniteTrainingError`; ``'skip'`` drops the optimizer
            step and zeroes the gradients; ``'rollback'`` restores the last
            known-good state and multiplies the learning rates by
            ``lr_backoff``. Defaults to ``'skip'``.
        max_consecutive_skips (int): Under ``'skip'``, the incident after
            this many consecutive skipped iterations escalates to
            ``escalate_to``. Defaults to 5.
        escalate_to (str): ``'rollback'`` or ``'raise'``: what ``'skip'``
            does when skipping is not enough (too many consecutive skips, or
            parameters that are already non-finite). Defaults to
            ``'rollback'``.
        snapshot_interval (int): Take an in-memory snapshot for rollback
            every this many healthy iterations (and once before training).
            Defaults to 50.
        keep_snapshots (int): In-memory snapshots kept. When a rollback to
            the newest one fails again before a new snapshot was taken, the
            next rollback goes one snapshot further back (a state taken
            after a spike can be finite but already ruined). Defaults to 2.
        rollback_source (str): ``'memory'`` (the last snapshot) or
            ``'checkpoint'`` (the last finite checkpoint written in this run,
            falling back to the snapshot). Defaults to ``'memory'``.
        lr_backoff (float): Factor in (0, 1] applied to every learning rate
            after a rollback and after a spike skipped by ``spike``. See
            :mod:`mmnanguard.engine.guard.lr_backoff` for how the param
            schedulers continue from it. Defaults to 0.5.
        recover_iters (int): After each backoff, ramp the learning rates
            linearly back to the schedule over this many iterations; 0
            keeps the backoff for the rest of the run. Defaults to 0.
        max_rollbacks (int): Rollbacks allowed before the guard raises.
            Defaults to 3.
        param_check_interval (int): Check that the parameters are finite
            after the optimizer step every this many iterations; 0 disables
            it. Defaults to 1.
        max_incidents (int): Incident folders written at most; later
            incidents are counted and logged only. Defaults to 20.
        save_batch (bool): Write ``batch.pth`` (the batch and the RNG
            states) into each incident folder. Defaults to True.
        top_k_grads (int): Parameters listed in ``top_grad_params``.
            Defaults to 10.
        history_size (int): Iterations kept in the ring buffer of loss
            terms, grad norms, learning rates and loss scales that each
            report includes. Defaults to 50.
        spike (dict, optional): Loss-spike detection, the fields of
            :class:`SpikeSettings` (``action``, ``factor``, ``window``,
            ``warmup``, ``keys``, ``grad_norm``, ``min_value``,
            ``backoff``); ``dict()`` takes their defaults. None disables
            it. Defaults to None.
    """

    policy: str = 'skip'
    max_consecutive_skips: int = 5
    escalate_to: str = 'rollback'
    snapshot_interval: int = 50
    keep_snapshots: int = 2
    rollback_source: str = 'memory'
    lr_backoff: float = 0.5
    max_rollbacks: int = 3
    param_check_interval: int = 1
    max_incidents: int = 20
    save_batch: bool = True
    top_k_grads: int = 10
    history_size: int = 50
    recover_iters: int = 0
    # a dict from the config, built into SpikeSettings by __post_init__
    spike: Optional[SpikeSettings] = None

    def __post_init__(self) -> None:
        _check_choice('policy', self.policy, POLICIES)
        _check_choice('escalate_to', self.escalate_to, ESCALATIONS)
        _check_choice(
            'rollback_source', self.rollback_source, ROLLBACK_SOURCES
        )
        for name in (
            'max_consecutive_skips',
            'snapshot_interval',
            'keep_snapshots',
            'max_rollbacks',
            'max_incidents',
            'top_k_grads',
            'history_size',
        ):
            _check_int(name, getattr(self, name), minimum=1)
        _check_int('param_check_interval', self.param_check_interval, 0)
        _check_int('recover_iters', self.recover_iters, 0)
        if self.spike is not None:
            self.spike = SpikeSettings.from_dict(self.spike)
        if (
            isinstance(self.lr_backoff, bool)
            or not isinstance(self.lr_backoff, (int, float))
            or not 0 < self.lr_backoff <= 1
        ):
            raise ValueError(
                f'nanguard: lr_backoff={self.lr_backoff!r} is invalid; '
                'expected a number in (0, 1], e.g. 0.5'
            )
        if not isinstance(self.save_batch, bool):
            raise TypeError(
                f'nanguard: save_batch={self.save_batch!r} is '
                'invalid; expected True or False'
            )

    @classmethod
    def from_dict(cls, cfg: Dict[str, Any]) -> 'GuardSettings':
        """Build from a config dict, refusing unknown keys by name."""
        refuse_unknown_keys(cls, cfg, 'setting')
        return cls(**cfg)

    def to_dict(self) -> Dict[str, Any]:
        """The settings as a plain dict."""
        return asdict(self)


def _check_choice(name: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise ValueError(
            f'nanguard: {name}={value!r} is invalid; allowed '
            f'values are {allowed}'
        )


def _check_int(name: str, value: Any, minimum: int) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < minimum
    ):
        raise ValueError(
            f'nanguard: {name}={value!r} is invalid; expected '
            f'an integer >= {minimum}'
        )
