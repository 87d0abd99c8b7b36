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

from typing import Any, Dict, List, Optional


def lr_schedulers(runner) -> List[Any]:
    """The runner's lr schedulers (of the first optimizer of a dict)."""
    schedulers = runner.param_schedulers or []
    if isinstance(schedulers, dict):
        schedulers = next(iter(schedulers.values()), [])
    return [s for s in schedulers if getattr(s, 'param_name', None) == 'lr']


class ScheduledLr:
    """Tracks which lr scheduler stepped last and reads its value.

    Iteration-based schedulers step after every iteration, epoch-based ones
    after the epoch's last iteration (so after the iteration-based ones),
    each list in config order. Between two reads, the scheduler that
    stepped last is therefore the last epoch-based one among those whose
    step count changed, else the last iteration-based one.
    """

    def __init__(self) -> None:
        self._steps: Dict[int, int] = {}
        self._current: Optional[Any] = None

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
        steps = {id(s): getattr(s, '_global_step', 0) for s in schedulers}
        changed = [
            s for s in schedulers if self._steps.get(id(s)) != steps[id(s)]
        ]
        if self._current is None or not self._steps:
            self._current = schedulers[-1]  # all stepped once when built
        elif changed:
            by_epoch = [s for s in changed if getattr(s, 'by_epoch', False)]
            self._current = (by_epoch or changed)[-1]
        self._steps = steps
        values = getattr(self._current, '_last_value', None) or []
        return float(values[0]) if values else None
