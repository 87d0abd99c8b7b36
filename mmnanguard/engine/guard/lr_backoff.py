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

Rollbacks compound: a rollback restores lrs that carry the multiplier of
the restored state and backs off from the smaller of that and the
multiplier in effect when training failed (0.5, then 0.25, ...), so a
retry does not climb back to the lr where it failed.

Scheduler hooks that set the lr from values they cached (mmyolo's
``YOLOv5ParamSchedulerHook`` in ``before_train_iter`` and
``after_train_epoch``) overwrite a backoff. :meth:`LrBackoff.enforce`
runs after every other hook's ``before_train_iter``, right before the
step: an lr that changed since the guard last saw it, and that is not
the value a param scheduler wrote (those continue from the backed-off
lr), was reset by someone else, and gets the multiplier again.
"""

from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from mmengine.hooks import ParamSchedulerHook

from .optim_members import optim_wrapper_members
from .state_checks import number_at, optional_count_at, state_dict_at

#: Schedulers that do not carry a backoff forward (see module docstring).
NON_CHAINING_SCHEDULERS = (
    'OneCycleLR',
    'OneCycleParamScheduler',
    'CosineRestartLR',
    'CosineRestartParamScheduler',
)


def param_groups(optim_wrapper) -> List[Dict[str, Any]]:
    """Every param group of every optimizer, in order (the optimizers'
    own groups: not mmengine's ``base_param_settings`` entry)."""
    return [
        group
        for wrapper in optim_wrapper_members(optim_wrapper)
        for group in wrapper.optimizer.param_groups
    ]


def live_lrs(optim_wrapper) -> List[float]:
    """The live lr of every param group of every optimizer, in the order
    of :func:`param_groups` (Python floats; no device value)."""
    return [float(group['lr']) for group in param_groups(optim_wrapper)]


def describe_lr_pairs(changes: Sequence[Tuple[float, float]]) -> str:
    """:func:`describe_lr_changes` of ``(before, after)`` pairs."""
    return describe_lr_changes(
        [before for before, _ in changes], [after for _, after in changes]
    )


def describe_lr_changes(
    before: Sequence[float], after: Sequence[float], limit: int = 4
) -> str:
    """``'0.02->0.01, 0.04->0.02'``: the distinct changes of the param
    groups, at most ``limit`` of them, then how many groups there are."""
    pairs = list(
        dict.fromkeys(f'{a:.3g}->{b:.3g}' for a, b in zip(before, after))
    )
    text = ', '.join(pairs[:limit])
    if len(pairs) > limit:
        text += f', ... ({len(before)} param groups)'
    return text


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
        #: The lr of every param group as the guard last saw or set it.
        self._seen: Optional[List[float]] = None

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

    def back_off_restored(
        self, optim_wrapper, restored_multiplier: float, iteration: int
    ) -> float:
        """Back off after a rollback, compounding.

        The restored lrs carry ``restored_multiplier``; the new multiplier
        is ``factor`` times the smaller of it and the multiplier in effect
        when training failed, so that each rollback to the same state
        halves the lr again (with ``factor=0.5``) instead of retrying the
        lr that failed.

        Args:
            optim_wrapper (OptimWrapper | OptimWrapperDict): The runner's,
                its lrs just restored.
            restored_multiplier (float): The multiplier of the restored
                state.
            iteration (int): The iteration the rollback happens at.

        Returns:
            float: The new multiplier.
        """
        restored_multiplier = float(restored_multiplier)
        target = min(self.multiplier, restored_multiplier) * self.factor
        scale_learning_rates(optim_wrapper, target / restored_multiplier)
        self.multiplier = target
        self._ramp_start = None
        if self.recover_iters:
            self._ramp_from = target
            self._ramp_start = iteration
        return target

    def remember(self, optim_wrapper) -> None:
        """Note every group's lr as the guard leaves it (after its own
        writes at the end of an iteration)."""
        self._seen = live_lrs(optim_wrapper)

    def changed_since_seen(self, optim_wrapper) -> List[int]:
        """The groups whose lr differs from what the guard last saw or
        set (read after the step: a change made after
        :meth:`enforce`, inside the step)."""
        if self._seen is None:
            return []
        lrs = live_lrs(optim_wrapper)
        if len(lrs) != len(self._seen):
            return []
        return [i for i, (a, b) in enumerate(zip(lrs, self._seen)) if a != b]

    def enforce(
        self, optim_wrapper, carried: Sequence[Set[float]]
    ) -> List[Tuple[float, float]]:
        """Right before the step: give the multiplier back to every lr that
        was reset since the guard last saw it.

        An lr that equals what the guard last saw, or a value a param
        scheduler wrote (``carried``: those continue from the backed-off
        lr), keeps the backoff. Any other value was set by someone else
        from values that do not carry it (a scheduler hook), and is
        multiplied by :attr:`multiplier`.

        Args:
            optim_wrapper (OptimWrapper | OptimWrapperDict): The runner's.
            carried (sequence[set[float]]): Per param group (the order of
                :func:`param_groups`), the values the lr schedulers wrote
                last.

        Returns:
            list[tuple]: ``(lr_found, lr_set)`` per group re-backed-off.
        """
        groups = param_groups(optim_wrapper)
        changes = []
        seen = self._seen
        if (
            self.multiplier != 1.0
            and seen is not None
            and len(seen) == len(groups)
        ):
            for i, group in enumerate(groups):
                lr = group['lr']
                if lr == seen[i] or (i < len(carried) and lr in carried[i]):
                    continue
                group['lr'] = lr * self.multiplier
                changes.append((float(lr), float(group['lr'])))
        self._seen = [float(group['lr']) for group in groups]
        return changes

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
        """Restore :meth:`state_dict`: the multiplier and the ramp's start
        value finite numbers in (0, 1] (a product of factors in (0, 1]),
        the ramp's start iteration None or an int >= 0.

        Raises:
            GuardStateError: A value is not of that form (nothing is
                taken).
        """
        state = state_dict_at(state, 'lr_backoff')
        multiplier = number_at(
            state.get('multiplier', 1.0),
            'lr_backoff.multiplier',
            0.0,
            1.0,
            low_open=True,
        )
        ramp_from = number_at(
            state.get('ramp_from', 1.0),
            'lr_backoff.ramp_from',
            0.0,
            1.0,
            low_open=True,
        )
        start = optional_count_at(
            state.get('ramp_start'), 'lr_backoff.ramp_start'
        )
        self.multiplier, self._ramp_from = multiplier, ramp_from
        self._ramp_start = start


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


def lr_setting_hooks(runner) -> List[str]:
    """The hooks that set the lr themselves: the runner's hooks built from a
    subclass of mmengine's ``ParamSchedulerHook`` (mmyolo's
    ``YOLOv5ParamSchedulerHook``), which steps no param scheduler of its
    own but writes ``group['lr']`` from the values it cached."""
    return [
        type(hook).__name__
        for hook in getattr(runner, 'hooks', [])
        if isinstance(hook, ParamSchedulerHook)
        and type(hook) is not ParamSchedulerHook
    ]
