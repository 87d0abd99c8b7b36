# Copyright (c) mmnanguard contributors. All rights reserved.
"""Multiply every learning rate by a factor after a rollback or a spike,
and optionally ramp it back to the schedule.

How mmengine 0.10.7's param schedulers see a backed-off lr: every one of
them is *chainable* (``_get_value`` reads the current ``group['lr']``;
there is no closed form path), and the backoff writes ``group['lr']``, so
they all continue from the scaled value:

* ``LinearLR``, ``MultiStepLR``, ``StepLR``, ``ExponentialLR``,
  ``ConstantLR`` multiply ``group['lr']`` by a factor per step: the backoff
  ``f`` persists exactly, ``lr_t = f * schedule_t``, to the end of the run.
* ``CosineAnnealingLR``, ``PolyLR`` (and ``CosineRestartLR`` inside a
  period) scale the distance to ``eta_min``: ``lr_t - eta_min =
  f' * (schedule_t - eta_min)`` with ``f' = (f * lr_k - eta_min) /
  (lr_k - eta_min)`` fixed at the backoff; with ``eta_min=0`` that is
  ``f`` exactly, and with ``eta_min>0`` the backed-off lr converges to
  ``eta_min`` like the schedule.
* ``OneCycleLR`` recomputes each value from the lrs it stored in the
  param group, and ``CosineRestartLR`` restarts at ``base_value * weight``:
  both discard the backoff at their next step (the hook logs a warning
  when such a scheduler is configured).

With ``recover_iters > 0`` the multiplier ``m`` on top of the schedule
ramps linearly from ``m * f`` back to 1 over ``recover_iters`` iterations:
after each iteration every lr is multiplied by ``m_new / m_old`` (before
the schedulers step). For the multiplicative schedulers (and the
annealing ones with ``eta_min=0``) the lr is then exactly
``m_t * schedule_t`` and lands on the schedule. For annealing schedulers
with ``eta_min > 0`` the ramp also scales eta_min's share, so it lands
slightly off the schedule (measured in ``test_lr_backoff.py``: at most
1.4 % above it with ``eta_min = lr / 10``, shrinking to 0 as both reach
``eta_min``).
"""

from typing import Any, Dict, List, Optional, Tuple

from .optim_members import optim_wrapper_members

#: Schedulers that do not carry a backoff forward (see module docstring).
NON_CHAINING_SCHEDULERS = (
    'OneCycleLR',
    'OneCycleParamScheduler',
    'CosineRestartLR',
    'CosineRestartParamScheduler',
)


def scale_learning_rates(
    optim_wrapper, factor: float
) -> List[Tuple[float, float]]:
    """Multiply ``lr`` of every param group of every optimizer by ``factor``.

    Args:
        optim_wrapper (OptimWrapper | OptimWrapperDict): The runner's.
        factor (float): In (0, 1] for a backoff, > 1 while recovering.

    Returns:
        list[tuple]: ``(lr_before, lr_after)`` per param group.
    """
    changes = []
    for wrapper in optim_wrapper_members(optim_wrapper):
        for group in wrapper.optimizer.param_groups:
            before = group['lr']
            group['lr'] = before * factor
            changes.append((before, group['lr']))
    return changes


class LrBackoff:
    """The learning-rate multiplier the guard keeps on top of the schedule.

    Args:
        factor (float): Backoff factor in (0, 1].
        recover_iters (int): Iterations over which the multiplier ramps back
            to 1 after each backoff; 0 keeps the backoff for good.
    """

    def __init__(self, factor: float, recover_iters: int = 0) -> None:
        self.factor = factor
        self.recover_iters = recover_iters
        #: The multiplier currently applied on top of the schedule.
        self.multiplier = 1.0
        self._ramp_from = 1.0
        self._ramp_start: Optional[int] = None

    def back_off(
        self, optim_wrapper, iteration: int
    ) -> List[Tuple[float, float]]:
        """Multiply every lr by ``factor`` at the end of ``iteration``.

        Returns:
            list[tuple]: ``(lr_before, lr_after)`` per param group.
        """
        changes = scale_learning_rates(optim_wrapper, self.factor)
        self.multiplier *= self.factor
        if self.recover_iters:
            self._ramp_from = self.multiplier
            self._ramp_start = iteration
        return changes

    def restored(self, multiplier: float) -> None:
        """The lrs were restored (rollback) to a state in which
        ``multiplier`` was applied; a ramp in progress is abandoned."""
        self.multiplier = float(multiplier)
        self._ramp_start = None

    def target(self, iteration: int) -> float:
        """The multiplier the ramp prescribes after ``iteration``."""
        if self._ramp_start is None:
            return self.multiplier
        done = min((iteration - self._ramp_start) / self.recover_iters, 1.0)
        return self._ramp_from + (1.0 - self._ramp_from) * done

    def step(self, optim_wrapper, iteration: int) -> Optional[float]:
        """Advance the ramp after ``iteration`` (before the schedulers
        step).

        Returns:
            float | None: The new multiplier when it changed, else None.
        """
        target = self.target(iteration)
        if target == self.multiplier:
            return None
        scale_learning_rates(optim_wrapper, target / self.multiplier)
        self.multiplier = target
        if target == 1.0:
            self._ramp_start = None
        return target

    def state_dict(self) -> Dict[str, Any]:
        """Multiplier and ramp, for checkpoints."""
        return dict(
            multiplier=self.multiplier,
            ramp_from=self._ramp_from,
            ramp_start=self._ramp_start,
        )

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.multiplier = float(state.get('multiplier', 1.0))
        self._ramp_from = float(state.get('ramp_from', 1.0))
        start = state.get('ramp_start')
        self._ramp_start = None if start is None else int(start)


def non_chaining_schedulers(runner) -> List[str]:
    """Names of the runner's param schedulers that discard a backoff."""
    schedulers = runner.param_schedulers or []
    if isinstance(schedulers, dict):
        schedulers = [s for group in schedulers.values() for s in group]
    return [
        type(s).__name__
        for s in schedulers
        if type(s).__name__ in NON_CHAINING_SCHEDULERS
    ]
