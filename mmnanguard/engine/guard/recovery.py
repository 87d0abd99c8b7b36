# Copyright (c) mmnanguard contributors. All rights reserved.
"""How the guard recovers once the policy has decided: snapshots of the
training state, rollback (from a verified checkpoint or from memory), the
lr backoff and its ramp back, and the known-good weights left in memory
before a stop."""

from typing import Any, Dict, List, Optional, Set, Tuple

from mmnanguard.fileio import LOAD_ERRORS, verified_checkpoints

from .lr_backoff import (
    LrBackoff,
    describe_lr_changes,
    describe_lr_pairs,
    live_lrs,
    lr_setting_hooks,
)
from .optim_members import optim_wrapper_members
from .rank_agreement import same_on_every_rank
from .scheduled_lr import carried_values
from .settings import GuardSettings
from .snapshot import TrainingSnapshot
from .snapshot_store import SnapshotStore
from .started import started
from .step_guard import StepGuard


class Recovery:
    """Snapshots, rollback and lr backoff of one guarded run.

    Args:
        settings (GuardSettings): The guard's settings.
        counters (dict): The guard's counters; ``rollbacks`` and
            ``lr_backoffs`` are counted here.
    """

    def __init__(self, settings: GuardSettings, counters: Dict[str, int]):
        self.settings = settings
        self.counters = counters
        self.snapshots = SnapshotStore(settings.keep_snapshots)
        self.lr_backoff = LrBackoff(
            settings.lr_backoff, settings.recover_iters
        )
        #: The snapshot the last rollback (or stop) restored.
        self.last_restored: Optional[TrainingSnapshot] = None
        #: Hooks that set the lr themselves (named in lr messages).
        self.lr_hooks: List[str] = []
        self._step_guard: Optional[StepGuard] = None
        self._work_dir: Optional[str] = None
        self._tried_checkpoints: Set[str] = set()
        self._ckpt_lr_multipliers: Dict[int, float] = {}
        #: Whether the lr messages of the current backoff were logged.
        self._reapply_logged = False
        self._lost_logged = False

    def start(
        self, runner, step_guard: StepGuard, checkpoints: bool = True
    ) -> None:
        """Before training: take the first snapshot (its parameters are
        checked with the first step's read).

        Args:
            runner (Runner): The runner.
            step_guard (StepGuard): The guard whose reads confirm the
                snapshots.
            checkpoints (bool): Whether a rollback may restore the run's
                verified checkpoints (an incident recorder is set up).
        """
        self._step_guard = step_guard
        self._work_dir = runner.work_dir if checkpoints else None
        self.lr_hooks = lr_setting_hooks(runner)
        self.lr_backoff.remember(runner.optim_wrapper)
        snapshot = TrainingSnapshot.capture(runner)
        # the lrs it holds carry the backoff in effect (a resumed one's)
        snapshot.lr_multiplier = self.lr_backoff.multiplier
        self.snapshots.add(snapshot, pending=True)
        step_guard.check_initial_params(all_params(runner))

    # -- snapshots and checkpoints ----------------------------------------
    def take_snapshot(self, runner, iteration: int) -> None:
        """Snapshot the state in which iteration ``iteration`` starts; it is
        confirmed by the parameter check of the step before it."""
        snapshot = TrainingSnapshot.capture(runner)
        snapshot.iteration = iteration
        snapshot.lr_multiplier = self.lr_backoff.multiplier
        guard = started(self._step_guard, 'the step guard')
        pending = guard.params_check.pending is not None
        self.snapshots.add(snapshot, pending=pending)

    def checkpoint_written(self, iteration: int) -> None:
        """A checkpoint of ``iteration`` passed the checks: a new known-good
        state, restorable again, with the lr multiplier it holds."""
        self._tried_checkpoints.clear()
        self._ckpt_lr_multipliers[iteration] = self.lr_backoff.multiplier

    def source(self) -> Optional[str]:
        """Where a rollback would restore from now (``'checkpoint'``,
        ``'memory'``), or None when nothing can be restored."""
        if self.settings.rollback_source == 'checkpoint' and (
            self._untried_checkpoints()
        ):
            return 'checkpoint'
        return 'memory' if self.snapshots else None

    def _untried_checkpoints(self) -> List[str]:
        """Checkpoints that finished and verify, newest first, less those a
        rollback already restored since the last checkpoint was written
        (restoring one again would repeat the failure)."""
        if self._work_dir is None:
            return []
        found = verified_checkpoints(self._work_dir)
        return [p for p in found if p not in self._tried_checkpoints]

    def _checkpoint_state(self, runner) -> Optional[TrainingSnapshot]:
        """The newest untried checkpoint that loads, or None (each one that
        does not is logged and skipped)."""
        for path in self._untried_checkpoints():
            self._tried_checkpoints.add(path)
            try:
                return TrainingSnapshot.from_checkpoint(runner, path)
            except LOAD_ERRORS as err:
                runner.logger.warning(
                    f'nanguard: cannot roll back to {path}: '
                    f'{type(err).__name__}: {err}; trying an older one'
                )
        return None

    # -- the actions ---------------------------------------------------------
    def rollback(self, runner) -> None:
        """Restore the newest known-good state and back the lrs off."""
        state = None
        if self.settings.rollback_source == 'checkpoint':
            state = self._checkpoint_state(runner)
            if not same_on_every_rank(None if state is None else state.source):
                state = None  # not the same file everywhere: the snapshot
            if state is None:
                runner.logger.warning(
                    'nanguard: no complete checkpoint that loads (and was '
                    'not restored already) is in '
                    f'{self._work_dir}; rolling back to the in-memory '
                    'snapshot'
                )
        if state is None:
            state = self.snapshots.for_rollback()
        failed_lrs = live_lrs(runner.optim_wrapper)
        state.restore(runner)
        self.last_restored = state
        self.snapshots.pending = None
        started(self._step_guard, 'the step guard').forget_pending()
        for wrapper in optim_wrapper_members(runner.optim_wrapper):
            wrapper.optimizer.zero_grad(set_to_none=True)
        # the restored lrs carry the multiplier of the restored state; the
        # backoff compounds on the smaller of it and the failing one's
        restored = getattr(
            state, 'lr_multiplier', None
        ) or self._ckpt_lr_multipliers.get(
            state.iteration, self.lr_backoff.multiplier
        )
        self.counters['lr_backoffs'] += 1
        self._new_backoff()
        multiplier = self.lr_backoff.back_off_restored(
            runner.optim_wrapper, restored, runner.iter
        )
        self.counters['rollbacks'] += 1
        self.lr_backoff.remember(runner.optim_wrapper)
        after = live_lrs(runner.optim_wrapper)
        runner.logger.warning(
            f'nanguard: rolled back to the state of iteration '
            f'{state.iteration} (from {state.source}); learning rates now '
            f'x{multiplier:.3g} of the schedule (lr_backoff='
            f'{self.settings.lr_backoff} per backoff); lr of the failed '
            f'step -> lr restored: {describe_lr_changes(failed_lrs, after)}'
            f"; rollback {self.counters['rollbacks']}/"
            f'{self.settings.max_rollbacks}{self.ramp_note()}'
        )

    def back_off(self, runner) -> List[Tuple[float, float]]:
        """Multiply the lrs by ``lr_backoff`` (a skipped spike); returns
        each group's ``(before, after)``."""
        self.counters['lr_backoffs'] += 1
        self._new_backoff()
        changes = self.lr_backoff.back_off(runner.optim_wrapper, runner.iter)
        self.lr_backoff.remember(runner.optim_wrapper)
        return changes

    def restore_before_stop(self, runner) -> str:
        """Leave the last known-good weights in memory before a stop whose
        step made them non-finite; returns what to add to the message."""
        newest = self.snapshots.newest
        if newest is None:
            return ''
        newest.restore(runner)
        self.last_restored = newest
        return (
            '; the weights in memory were restored to iteration '
            f'{newest.iteration}'
        )

    def ramp_note(self) -> str:
        """The message part that says the lrs ramp back, if they do."""
        n = self.settings.recover_iters
        return (
            f'; ramping back to the schedule over {n} iterations' if n else ''
        )

    def _new_backoff(self) -> None:
        """A new backoff: its lr messages are logged once more."""
        self._reapply_logged = False
        self._lost_logged = False

    # -- the lr backoff around each step -------------------------------------
    def enforce_backoff(self, runner) -> None:
        """Right before the step (after every hook's
        ``before_train_iter``): give the lr backoff back to the lrs that a
        hook reset from its own values since the guard last saw them (see
        :meth:`LrBackoff.enforce`); logged once per backoff."""
        changes = self.lr_backoff.enforce(
            runner.optim_wrapper, carried_values(runner)
        )
        if not changes or self._reapply_logged:
            return
        self._reapply_logged = True
        who = (
            f'by {", ".join(self.lr_hooks)}, which sets the lr from its '
            'own stored values'
            if self.lr_hooks
            else 'by a hook or code other than the param schedulers'
        )
        runner.logger.warning(
            f'nanguard: the lr of {len(changes)} param group(s) was reset '
            f'{who}; the lr backoff is re-applied before each step '
            f'(x{self.lr_backoff.multiplier:.3g} of what it sets) from '
            f'iteration {runner.iter}: '
            f'{describe_lr_pairs(changes)}'
        )

    def check_backoff_held(self, runner) -> None:
        """After the step: warn (once per backoff) when an lr changed after
        :meth:`enforce_backoff` ran, so the step did not use the backoff."""
        if self.lr_backoff.multiplier == 1.0 or self._lost_logged:
            return
        changed = self.lr_backoff.changed_since_seen(runner.optim_wrapper)
        if changed:
            self._lost_logged = True
            runner.logger.warning(
                f'nanguard: the lr of param group(s) {changed[:8]} changed '
                "after every hook's before_train_iter ran (in the model's "
                'train_step, the optim wrapper, or a hook that runs '
                'later): the step of iteration '
                f'{runner.iter} did not use the lr backoff '
                f'x{self.lr_backoff.multiplier:.3g}; nanguard cannot '
                'enforce it there'
            )

    def after_iteration(self, runner) -> None:
        """Ramp the lr backoff back (logged when it reaches the schedule)
        and remember the lrs the next step starts from."""
        if self.lr_backoff.step(runner.optim_wrapper, runner.iter) == 1.0:
            runner.logger.info(
                'nanguard: learning rates back on the schedule after '
                f'iteration {runner.iter} (recover_iters='
                f'{self.settings.recover_iters})'
            )
        self.lr_backoff.remember(runner.optim_wrapper)


def all_params(runner) -> List[Any]:
    """Every parameter of every optimizer the runner steps."""
    return [
        p
        for w in optim_wrapper_members(runner.optim_wrapper)
        for g in w.optimizer.param_groups
        for p in g['params']
    ]
