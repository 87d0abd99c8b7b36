# Copyright (c) mmnanguard contributors. All rights reserved.
"""What the guard does with each iteration's verdict: counters, history,
snapshots, the policy (skip, rollback, raise), the lr backoff, and the
incident event its listeners receive."""

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from mmnanguard.fileio import LOAD_ERRORS, verified_checkpoints

from ..incident import IncidentKind, IncidentRecorder, describe
from .exceptions import (
    NonFiniteTrainingError,
    PoisonedCheckpointError,
    TrainingSpikeError,
)
from .finite import nonfinite_paths
from .history import IterationHistory
from .incident_event import IncidentEvent
from .lr_backoff import (
    LrBackoff,
    describe_lr_changes,
    live_lrs,
    lr_setting_hooks,
)
from .optim_members import optim_wrapper_members
from .policy import decide_action
from .rank_agreement import same_on_every_rank
from .report import build_report
from .scheduled_lr import ScheduledLr, carried_values
from .settings import GuardSettings
from .snapshot import TrainingSnapshot, unwrap_model, write_runner_state
from .snapshot_store import SnapshotStore
from .spike_detector import SpikeDetector, spikes_as_dicts
from .state_checks import count_at, state_dict_at
from .step_guard import StepGuard
from .verdict import IterationOutcome, StepVerdict

#: Counters published through the MessageHub as ``train/nanguard_<name>``
#: and saved in checkpoints under ``nanguard``. None contains ``loss``,
#: ``time`` or ``grad_norm``: ``LogProcessor`` would average those over its
#: window instead of showing the current count.
COUNTERS = (
    'incidents',
    'skipped',
    'rollbacks',
    'nonfinite_objective',
    'nonfinite_grad',
    'nonfinite_params',
    'poisoned_checkpoints',
    'amp_skipped',
    'spikes',
    'vetoed',
    'lr_backoffs',
)

#: Called as ``listener(runner, event)`` for every incident.
Listener = Callable[[Any, IncidentEvent], None]


@dataclass
class IterationTrace:
    """What the hook keeps of one iteration for a report and a replay:
    references, no copies.

    Args:
        data_batch: The batch as the dataloader gave it.
        rng_state (dict, optional): The RNG states at its start.
    """

    data_batch: Any = None
    rng_state: Optional[Dict[str, Any]] = None


def incident_kind(verdict: Optional[StepVerdict]) -> Optional[IncidentKind]:
    """The incident a step's verdict shows, or None for a healthy step (a
    GradScaler skip and a logged spike are not incidents)."""
    if verdict is None:
        return None
    if verdict.params_bad:
        return IncidentKind.NONFINITE_PARAMS
    if not verdict.loss_finite:
        return IncidentKind.NONFINITE_LOSS
    if not verdict.grad_finite and verdict.amp is None:
        return IncidentKind.NONFINITE_GRAD
    if verdict.spike_acts and (verdict.spikes or verdict.veto):
        grad_only = verdict.spikes and all(
            s.stage == 'grad' for s in verdict.spikes
        )
        return (
            IncidentKind.GRAD_SPIKE if grad_only else IncidentKind.LOSS_SPIKE
        )
    if verdict.veto is not None:
        return IncidentKind.VETOED_UPDATE
    return None


def _worst(outcome: IterationOutcome) -> Optional[StepVerdict]:
    """The verdict of the iteration that decides (an incident first)."""
    for verdict in outcome.verdicts:
        if incident_kind(verdict) is not None:
            return verdict
    return outcome.last


class GuardResponder:
    """Acts on each iteration's outcome and on each checkpoint.

    Args:
        settings (GuardSettings): The guard's settings.
    """

    def __init__(self, settings: GuardSettings) -> None:
        self.settings = settings
        self.counters: Dict[str, int] = {k: 0 for k in COUNTERS}
        self.history = IterationHistory(settings.history_size)
        self.snapshots = SnapshotStore(settings.keep_snapshots)
        self.lr_backoff = LrBackoff(
            settings.lr_backoff, settings.recover_iters
        )
        self.scheduled_lr = ScheduledLr()
        self.spike_detector: Optional[SpikeDetector] = None
        if settings.spike is not None:
            self.spike_detector = SpikeDetector(settings.spike)
        self.listeners: List[Listener] = []
        self.consecutive_skips = 0
        self.last_report = None
        #: The snapshot the last rollback (or raise) restored.
        self.last_restored: Optional[TrainingSnapshot] = None
        self._tried_checkpoints: Set[str] = set()
        self._work_dir = ''
        self.recorder: Optional[IncidentRecorder] = None
        self.step_guard: Optional[StepGuard] = None
        self._base_lrs: Optional[List[float]] = None
        self._ckpt_lr_multipliers: Dict[int, float] = {}
        #: Hooks that set the lr themselves (named in lr messages).
        self._lr_hooks: List[str] = []
        #: Whether the lr messages of the current backoff were logged.
        self._reapply_logged = False
        self._lost_logged = False

    # -- lifecycle -----------------------------------------------------------
    def start(self, runner, step_guard: StepGuard, recorder) -> None:
        """Before training: take the first snapshot (its parameters are
        checked with the first step's read)."""
        self.step_guard = step_guard
        self.recorder = recorder
        self._work_dir = runner.work_dir
        self._lr_hooks = lr_setting_hooks(runner)
        # without lr schedulers the starting lrs are the schedule, unless
        # a scheduler hook sets them
        self._base_lrs = (
            None if self._lr_hooks else live_lrs(runner.optim_wrapper)
        )
        self.lr_backoff.remember(runner.optim_wrapper)
        snapshot = TrainingSnapshot.capture(runner)
        # the lrs it holds carry the backoff in effect (a resumed one's)
        snapshot.lr_multiplier = self.lr_backoff.multiplier
        self.snapshots.add(snapshot, pending=True)
        step_guard.check_initial_params(self._all_params(runner))

    def snapshot_due(self, iteration: int) -> bool:
        """Whether the state after ``iteration``'s step is snapshotted."""
        return (iteration + 1) % self.settings.snapshot_interval == 0

    def on_iteration(
        self,
        runner,
        outcome: IterationOutcome,
        traces: Dict[int, IterationTrace],
    ) -> None:
        """Act on what the steps of ``runner.iter`` decided."""
        verdict = _worst(outcome)
        self._check_backoff_held(runner)
        self.counters['skipped'] += outcome.skipped
        self.counters['amp_skipped'] += outcome.amp_skipped
        if verdict is not None:
            dropped = self.snapshots.confirm(verdict.params_finite)
            if dropped is not None:
                runner.logger.warning(
                    'nanguard: the parameters after the step of iteration '
                    f'{dropped.iteration - 1} are non-finite; its snapshot '
                    'is dropped'
                )
        self.history.append(
            runner.iter,
            verdict.loss_terms if verdict else {},
            verdict.grad_norm if verdict else None,
            loss_scale=outcome.loss_scale(),
            lrs=live_lrs(runner.optim_wrapper),
            lrs_scheduled=self.scheduled_lr.read_groups(
                runner, self._base_lrs, self.lr_backoff.multiplier
            ),
        )
        kind = incident_kind(verdict)
        if verdict is not None and verdict.spikes and kind is None:
            self.counters['spikes'] += 1
            self.history.mark_last('spike')
            runner.logger.warning(
                f'nanguard: spike at iteration {runner.iter} (logged only, '
                'spike.action=log): '
                + ', '.join(s.describe() for s in verdict.spikes)
            )
        if kind is not None:
            self._incident(runner, kind, verdict, traces)
        elif outcome.steps:
            self.consecutive_skips = 0
            if self.snapshot_due(runner.iter):
                self._take_snapshot(runner, runner.iter + 1)
        if self.lr_backoff.step(runner.optim_wrapper, runner.iter) == 1.0:
            runner.logger.info(
                'nanguard: learning rates back on the schedule after '
                f'iteration {runner.iter} (recover_iters='
                f'{self.settings.recover_iters})'
            )
        self.lr_backoff.remember(runner.optim_wrapper)
        self.publish(runner)

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
            f'by {", ".join(self._lr_hooks)}, which sets the lr from its '
            'own stored values'
            if self._lr_hooks
            else 'by a hook or code other than the param schedulers'
        )
        runner.logger.warning(
            f'nanguard: the lr of {len(changes)} param group(s) was reset '
            f'{who}; the lr backoff is re-applied before each step '
            f'(x{self.lr_backoff.multiplier:.3g} of what it sets) from '
            f'iteration {runner.iter}: '
            f'{describe_lr_changes(*zip(*changes))}'
        )

    def _check_backoff_held(self, runner) -> None:
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

    def check_pending_params(
        self, runner, traces: Dict[int, IterationTrace]
    ) -> bool:
        """Read a queued parameter check now (one read: after training and
        before a checkpoint, which must not wait for the next step's read)
        and handle non-finite parameters as the incident of that step.

        Returns:
            bool: Whether there was such an incident (its policy restored a
            known-good state, or raised).
        """
        iteration = self.step_guard.pending_params_check()
        read = self.step_guard.read_pending_params()
        finite, own_finite = (None, None) if read is None else read
        self.snapshots.confirm(finite)
        if finite is False:
            verdict = StepVerdict(
                iteration=runner.iter,
                params_finite=False,
                params_iteration=iteration,
                local_params_finite=own_finite,
            )
            self._incident(
                runner, IncidentKind.NONFINITE_PARAMS, verdict, traces
            )
            return True
        return False

    def check_checkpoint(
        self,
        runner,
        checkpoint: dict,
        traces: Dict[int, Any],
        alone: bool = False,
    ) -> None:
        """Refuse to write non-finite state; store the guard's state.

        Args:
            runner: The runner.
            checkpoint (dict): The checkpoint about to be written.
            traces (dict): The hook's iteration traces.
            alone (bool): This rank checks without the others (a
                distributed run whose ranks did not agree before this
                save): no collective is made, a queued parameter check
                stays queued for the next step's read, and a non-finite
                state is refused by raising, since no recovery can be
                agreed. Defaults to False.
        """
        if (
            self.step_guard is not None
            and not alone
            and self.check_pending_params(runner, traces)
        ):
            write_runner_state(runner, checkpoint)  # the restored state
        bad = nonfinite_paths(
            dict(
                state_dict=checkpoint.get('state_dict'),
                optimizer=checkpoint.get('optimizer'),
            )
        )
        if bad and alone:
            raise PoisonedCheckpointError(
                'nanguard: refusing to write the checkpoint of iteration '
                f'{runner.iter}: non-finite {bad[:5]}. It was checked on '
                'this rank alone (save_checkpoint was called on this rank '
                'only), so no recovery could be agreed with the other '
                'ranks; call runner.save_checkpoint on every rank, as '
                "mmengine's CheckpointHook does."
            )
        if bad:
            self._incident(
                runner,
                IncidentKind.NONFINITE_CHECKPOINT,
                None,
                traces,
                nonfinite_tensors=bad[:50],
            )
            write_runner_state(runner, checkpoint)  # the restored state
        self._tried_checkpoints.clear()  # a new known-good state
        checkpoint['nanguard'] = self.state_dict()
        self._ckpt_lr_multipliers[
            checkpoint.get('meta', {}).get('iter', -1)
        ] = self.lr_backoff.multiplier

    def checkpoint_incident(
        self, runner, traces: Dict[int, Any], nonfinite_tensors: List[str]
    ) -> None:
        """Handle a non-finite state that the ranks agreed on before a
        checkpoint write (:mod:`mmnanguard.engine.runner.checkpoint_agreement`;
        ``nonfinite_tensors``: this rank's findings, possibly none)."""
        self._incident(
            runner,
            IncidentKind.NONFINITE_CHECKPOINT,
            None,
            traces,
            nonfinite_tensors=nonfinite_tensors[:50],
        )

    def state_dict(self) -> Dict[str, Any]:
        """Counters, lr backoff and spike statistics, for checkpoints."""
        detector = self.spike_detector
        return dict(
            counters=dict(self.counters),
            lr_backoff=self.lr_backoff.state_dict(),
            spike=detector.state_dict() if detector else None,
        )

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore :meth:`state_dict`, every value checked first
        (:mod:`.state_checks`).

        Raises:
            GuardStateError: A value is not of the form the guard writes
                (a NaN multiplier, a negative counter); nothing is taken.
        """
        state = state_dict_at(state, '')
        saved = state_dict_at(state.get('counters', {}), 'counters')
        counters = {
            name: count_at(saved[name], f'counters.{name}')
            for name in COUNTERS
            if name in saved
        }
        backoff = state.get('lr_backoff')
        spike = state.get('spike')
        if backoff is not None:  # checked whole before anything is taken
            LrBackoff(self.lr_backoff.factor).load_state_dict(backoff)
        if self.spike_detector is not None and spike:
            self.spike_detector.load_state_dict(spike)
        if backoff is not None:
            self.lr_backoff.load_state_dict(backoff)
        self.counters.update(counters)

    def publish(self, runner) -> None:
        """The counters and the lr factor, through the MessageHub."""
        for name, value in self.counters.items():
            runner.message_hub.update_scalar(f'train/nanguard_{name}', value)
        runner.message_hub.update_scalar(
            'train/nanguard_lr_factor', self.lr_backoff.multiplier
        )

    # -- incidents -------------------------------------------------------
    def _incident(
        self,
        runner,
        kind: IncidentKind,
        verdict: Optional[StepVerdict],
        traces: Dict[int, IterationTrace],
        **extra: Any,
    ) -> None:
        self.counters['incidents'] += 1
        self.counters[kind.counter] += 1
        action, reason = decide_action(
            self.settings,
            kind,
            self.consecutive_skips,
            self.counters['rollbacks'],
            self._rollback_source() is not None,
        )
        if kind.is_veto and verdict is not None:
            vetoed = '; '.join(s.describe() for s in verdict.spikes)
            reason = f'{vetoed or verdict.veto}; {reason}'
        self.history.mark_last('spike' if kind.is_veto else 'incident')
        iteration = _bad_iteration(kind, verdict, runner.iter)
        if iteration != runner.iter:
            extra['detected_at'] = runner.iter
        if kind.is_spike and verdict is not None:
            extra['spikes'] = spikes_as_dicts(verdict.spikes)
        trace = traces.get(iteration) or IterationTrace()
        top = []
        if verdict is not None and kind in (
            IncidentKind.NONFINITE_GRAD,
            IncidentKind.GRAD_SPIKE,
        ):
            top = verdict.top_grad_params(
                self.step_guard.named_params, self.settings.top_k_grads
            )
        report = build_report(
            runner=runner,
            kind=kind,
            action=action,
            reason=reason,
            iteration=iteration,
            verdict=verdict,
            data_batch=trace.data_batch,
            history=self.history.to_list(),
            top_grad_params=top,
            **extra,
        )
        folder = self._write(report, trace, iteration, action == 'raise')
        self.last_report = report
        event = IncidentEvent(
            report=report,
            folder=folder,
            data_batch=trace.data_batch,
            rng_state=trace.rng_state,
            snapshots=tuple(self.snapshots),
        )
        for listener in self.listeners:
            listener(runner, event)
        message = describe(report)
        runner.logger.error(f'nanguard: {message}')
        if action == 'raise':
            self._raise(runner, kind, message)
        if action == 'rollback':
            self._rollback(runner)
        else:
            self.consecutive_skips += 1
            if kind.is_spike and self.settings.spike.backoff:
                changes = self._back_off(runner)
                runner.logger.warning(
                    'nanguard: spike skipped; learning rates x'
                    f'{self.settings.lr_backoff} (now '
                    f'x{self.lr_backoff.multiplier:.3g} of the schedule): '
                    f'{describe_lr_changes(*zip(*changes))}'
                    f'{self._ramp_note()}'
                )

    def _write(
        self, report, trace: IterationTrace, iteration: int, force: bool
    ) -> Optional[str]:
        batch = None
        if self.settings.save_batch:
            batch = dict(
                data_batch=trace.data_batch,
                rng_state=trace.rng_state,
                iteration=iteration,
            )
        data = report.to_dict()
        folder = self.recorder.record(data, batch, force=force)
        report.report_path = data.get('report_path')
        report.write_error = data.get('write_error')
        return folder

    def _raise(self, runner, kind: IncidentKind, message: str) -> None:
        self.publish(runner)
        if kind.weights_damaged and self.snapshots.newest is not None:
            # the step already made the weights non-finite: leave the last
            # known-good ones in memory before stopping
            self.snapshots.newest.restore(runner)
            self.last_restored = self.snapshots.newest
            message += (
                '; the weights in memory were restored to iteration '
                f'{self.snapshots.newest.iteration}'
            )
        fix = stop_fix(runner, self.last_report)
        if fix:
            message += f'; the fix: {fix}'
        error = NonFiniteTrainingError
        if kind.is_spike:
            error = TrainingSpikeError
        elif kind is IncidentKind.NONFINITE_CHECKPOINT:
            error = PoisonedCheckpointError
        raise error(f'nanguard stopped training: {message}')

    # -- state -------------------------------------------------------------
    def _rollback_source(self) -> Optional[str]:
        if self.settings.rollback_source == 'checkpoint' and (
            self._untried_checkpoints()
        ):
            return 'checkpoint'
        return 'memory' if self.snapshots else None

    def _untried_checkpoints(self) -> List[str]:
        """Checkpoints that finished and verify, newest first, less those a
        rollback already restored since the last checkpoint was written
        (restoring one again would repeat the failure)."""
        if self.recorder is None:
            return []
        found = verified_checkpoints(self._work_dir)
        return [p for p in found if p not in self._tried_checkpoints]

    def _take_snapshot(self, runner, iteration: int) -> None:
        """Snapshot the state in which iteration ``iteration`` starts; it is
        confirmed by the parameter check of the step before it."""
        snapshot = TrainingSnapshot.capture(runner)
        snapshot.iteration = iteration
        snapshot.lr_multiplier = self.lr_backoff.multiplier
        pending = self.step_guard.pending_params_check() is not None
        self.snapshots.add(snapshot, pending=pending)

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

    def _rollback(self, runner) -> None:
        state = None
        if self.settings.rollback_source == 'checkpoint':
            state = self._checkpoint_state(runner)
            if not same_on_every_rank(state and state.source):
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
        self.step_guard.forget_pending()
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
        self.consecutive_skips = 0
        self.lr_backoff.remember(runner.optim_wrapper)
        after = live_lrs(runner.optim_wrapper)
        runner.logger.warning(
            f'nanguard: rolled back to the state of iteration '
            f'{state.iteration} (from {state.source}); learning rates now '
            f'x{multiplier:.3g} of the schedule (lr_backoff='
            f'{self.settings.lr_backoff} per backoff); lr of the failed '
            f'step -> lr restored: {describe_lr_changes(failed_lrs, after)}'
            f"; rollback {self.counters['rollbacks']}/"
            f'{self.settings.max_rollbacks}{self._ramp_note()}'
        )

    def _back_off(self, runner) -> List[Tuple[float, float]]:
        self.counters['lr_backoffs'] += 1
        self._new_backoff()
        changes = self.lr_backoff.back_off(runner.optim_wrapper, runner.iter)
        self.lr_backoff.remember(runner.optim_wrapper)
        return changes

    def _new_backoff(self) -> None:
        """A new backoff: its lr messages are logged once more."""
        self._reapply_logged = False
        self._lost_logged = False

    def _ramp_note(self) -> str:
        n = self.settings.recover_iters
        return (
            f'; ramping back to the schedule over {n} iterations' if n else ''
        )

    @staticmethod
    def _all_params(runner) -> List[Any]:
        return [
            p
            for w in optim_wrapper_members(runner.optim_wrapper)
            for g in w.optimizer.param_groups
            for p in g['params']
        ]


def stop_fix(runner, report: Any) -> Optional[str]:
    """The fix a stop message names: the first remedy of the stopping
    incident's diagnosis, else (no diagnosis ran) the sentence for a head
    that feeds encoded deltas to a box loss, found in the built model.

    Args:
        runner (Runner): The runner.
        report (IncidentReport, optional): The stopping incident's report.

    Returns:
        str | None: The fix, or None when nothing names one.
    """
    diagnosis = (report.get('diagnosis') if report is not None else None) or {}
    if diagnosis.get('remedy'):
        return diagnosis['remedy'][0]
    # imported here: the models package is not needed to guard a step
    from mmnanguard.models.loss_kind import encoded_deltas_fix

    try:
        return encoded_deltas_fix(unwrap_model(runner.model))
    except Exception as err:  # noqa: BLE001  (the stop must not fail)
        runner.logger.warning(
            'nanguard: could not check the heads for a box loss fed '
            f'encoded deltas: {type(err).__name__}: {err}'
        )
        return None


def _bad_iteration(
    kind: IncidentKind, verdict: Optional[StepVerdict], current: int
) -> int:
    """The iteration whose update was bad: the step before a failed
    parameter check, the micro-batch with the first non-finite loss."""
    if verdict is None:
        return current
    if kind is IncidentKind.NONFINITE_PARAMS:
        if verdict.params_iteration is not None:
            return verdict.params_iteration
        return current
    if (
        kind is IncidentKind.NONFINITE_LOSS
        and verdict.loss_bad_iteration is not None
    ):
        return verdict.loss_bad_iteration
    return current
