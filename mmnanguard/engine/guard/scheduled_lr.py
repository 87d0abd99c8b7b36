# Copyright (c) mmnanguard contributors. All rights reserved.
"""The learning rate the configured param schedulers prescribe.

mmengine's param schedulers step after each iteration (or epoch) and keep
the values of the param group after their step in ``_last_value``. Until
the next step, the ``_last_value`` of the scheduler that stepped last is
the lr the schedule prescribes for the current iteration: an lr in the
param group that differs from it was written by someone else (a hand-set
lr, a fault). The guard's own lr backoff is part of the prescribed value:
it is applied before the schedulers step, and they continue from it (see
:mod:`.lr_backoff`).
"""

from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from mmengine.optim import OptimWrapperDict

from mmnanguard.compat.mmengine_private import last_values, scheduler_steps


def _lr_only(schedulers: Any) -> List[Any]:
    return [
        s for s in schedulers or [] if getattr(s, 'param_name', None) == 'lr'
    ]


def schedulers_by_optimizer(runner) -> List[Tuple[Any, int, List[Any]]]:
    """Per optimizer of the runner, in order: its key (None for a single
    optimizer), its number of param groups and its lr schedulers."""
    wrapper = runner.optim_wrapper
    schedulers = runner.param_schedulers or []
    if isinstance(wrapper, OptimWrapperDict):
        members = list(wrapper.optim_wrappers.items())
    else:
        members = [(None, wrapper)]
    found = []
    for key, member in members:
        if isinstance(schedulers, dict):
            own = schedulers.get(key, []) if key is not None else []
        else:
            own = schedulers if key is None else []
        found.append((key, len(member.optimizer.param_groups), _lr_only(own)))
    return found


def carried_values(runner) -> List[Set[float]]:
    """Per param group (the order of
    :func:`~.lr_backoff.param_groups`), the values its lr schedulers wrote
    at their last step (``_last_value``): an lr equal to one of them was
    set by a scheduler, which continues from the lr it finds."""
    carried: List[Set[float]] = []
    for _key, count, schedulers in schedulers_by_optimizer(runner):
        for i in range(count):
            carried.append(
                {
                    float(last_values(s)[i])
                    for s in schedulers
                    if len(last_values(s)) > i
                }
            )
    return carried


def lr_schedulers(runner) -> List[Any]:
    """The runner's lr schedulers (of the first optimizer of a dict)."""
    schedulers = runner.param_schedulers or []
    if isinstance(schedulers, dict):
        schedulers = next(iter(schedulers.values()), [])
    return _lr_only(schedulers)


class ScheduledLr:
    """Tracks which lr scheduler stepped last and reads its value.

    Iteration-based schedulers step after every iteration, epoch-based ones
    after the epoch's last iteration (so after the iteration-based ones),
    each list in config order. Between two reads, the scheduler that
    stepped last is therefore the last epoch-based one among those whose
    step count changed, else the last iteration-based one.
    """

    def __init__(self) -> None:
        self._steps: Dict[Any, Dict[int, int]] = {}
        self._current: Dict[Any, Any] = {}

    def read(
        self, runner, base_lr: Optional[float], multiplier: float = 1.0
    ) -> Optional[float]:
        """The lr of the first param group the schedule prescribes now.

        Args:
            runner (Runner): The runner, between two scheduler steps.
            base_lr (float, optional): The lr training started with, the
                prescribed value when no lr scheduler is configured.
            multiplier (float): The guard's lr backoff, on top of
                ``base_lr`` when no lr scheduler is configured.

        Returns:
            float | None: The prescribed lr, or None when it is unknown.
        """
        schedulers = lr_schedulers(runner)
        if not schedulers:
            return None if base_lr is None else base_lr * multiplier
        values = self._last_values(None, schedulers)
        return float(values[0]) if values else None

    def read_groups(
        self,
        runner,
        base_lrs: Optional[Sequence[float]],
        multiplier: float = 1.0,
    ) -> List[Optional[float]]:
        """The lr the schedule prescribes now for every param group of
        every optimizer (the order of :func:`~.lr_backoff.param_groups`).

        Args:
            runner (Runner): The runner, between two scheduler steps.
            base_lrs (sequence[float], optional): Every group's lr when
                training started: the prescribed values of an optimizer
                without lr schedulers (times ``multiplier``); None when
                they are unknown (a scheduler hook sets the lr).
            multiplier (float): The guard's lr backoff.

        Returns:
            list[float | None]: Per group; None where unknown.
        """
        out: List[Optional[float]] = []
        for key, count, schedulers in schedulers_by_optimizer(runner):
            if schedulers:
                values = self._last_values(key, schedulers)
                out += [
                    float(values[i]) if i < len(values) else None
                    for i in range(count)
                ]
            else:
                start = len(out)
                own = list(base_lrs or [])[start : start + count]
                if len(own) == count:
                    out += [float(b) * multiplier for b in own]
                else:
                    out += [None] * count
        return out

    def _last_values(self, key: Any, schedulers: List[Any]) -> List[Any]:
        """``_last_value`` of the scheduler of optimizer ``key`` that
        stepped last."""
        steps = {id(s): scheduler_steps(s) for s in schedulers}
        before = self._steps.get(key)
        current = self._current.get(key)
        if current is None or before is None:
            current = schedulers[-1]  # all stepped once when built
        else:
            changed = [
                s for s in schedulers if before.get(id(s)) != steps[id(s)]
            ]
            if changed:
                by_epoch = [
                    s for s in changed if getattr(s, 'by_epoch', False)
                ]
                current = (by_epoch or changed)[-1]
        self._current[key] = current
        self._steps[key] = steps
        return last_values(current)
