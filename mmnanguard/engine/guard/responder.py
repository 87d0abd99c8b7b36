# Copyright (c) mmnanguard contributors. All rights reserved.
"""What the guard does with each iteration's verdict: counters, history,
the policy's decision (skip, rollback, raise), the incident report and the
event its listeners receive; the recovery itself (snapshots, rollback, lr
backoff) is :class:`~.recovery.Recovery`'s."""

from typing import Any, Dict, List, Optional

from ..incident import (
    IncidentAction,
    IncidentKind,
    IncidentRecorder,
    IncidentReport,
    describe,
)
from .counters import COUNTERS, checked_counters
from .exceptions import (
    NonFiniteTrainingError,
    PoisonedCheckpointError,
    TrainingSpikeError,
)
from .finite import nonfinite_paths
from .history import IterationHistory
from .incident_event import (
    IncidentEvent,
    IterationTrace,
    Listener,
    ListenersTurn,
)
from .lr_backoff import LrBackoff, describe_lr_pairs, live_lrs
from .policy import decide_action
from .recovery import Recovery
from .report import build_report
from .scheduled_lr import ScheduledLr
from .settings import GuardSettings
from .snapshot import TrainingSnapshot, write_runner_state
from .snapshot_store import SnapshotStore
from .spike_detector import SpikeDetector, spikes_as_dicts
from .started import started
from .state_checks import state_dict_at
from .step_guard import StepGuard
from .stop_fix import stop_fix
from .verdict import IterationOutcome, StepVerdict
from .verdict_kind import bad_iteration, deciding_verdict, incident_kind


class GuardResponder:
    """Acts on each iteration's outcome and on each checkpoint.

    Args:
        settings (GuardSettings): The guard's settings.
    """

    def __init__(self, settings: GuardSettings) -> None:
        self.settings = settings
        self.counters: Dict[str, int] = {k: 0 for k in COUNTERS}
        self.history = IterationHistory(settings.history_size)
        #: Snapshots, rollback and lr backoff.
        self.recovery = Recovery(settings, self.counters)
        self.scheduled_lr = ScheduledLr()
        self.spike_detector: Optional[SpikeDetector] = None
        if settings.spike is not None:
            self.spike_detector = SpikeDetector(settings.spike)
        self.listeners: List[Listener] = []
        self.consecutive_skips = 0
        self.last_report: Optional[IncidentReport] = None
        self.recorder: Optional[IncidentRecorder] = None
        self.step_guard: Optional[StepGuard] = None
        self._base_lrs: Optional[List[float]] = None

    @property
    def snapshots(self) -> SnapshotStore:
        """The snapshots a rollback restores."""
        return self.recovery.snapshots

    @property
    def lr_backoff(self) -> LrBackoff:
        """The lr backoff in effect."""
        return self.recovery.lr_backoff

    @property
    def last_restored(self) -> Optional[TrainingSnapshot]:
        """The snapshot the last rollback (or raise) restored."""
        return self.recovery.last_restored

    # -- lifecycle -----------------------------------------------------------
    def start(self, runner, step_guard: StepGuard, recorder) -> None:
        """Before training: take the first snapshot (its parameters are
        checked with the first step's read)."""
        self.step_guard = step_guard
        self.recorder = recorder
        self.recovery.start(runner, step_guard, recorder is not None)
        # without lr schedulers the starting lrs are the schedule, unless
        # a scheduler hook sets them
        self._base_lrs = (
            None if self.recovery.lr_hooks else live_lrs(runner.optim_wrapper)
        )

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
        verdict = deciding_verdict(outcome)
        self.recovery.check_backoff_held(runner)
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
                self.recovery.take_snapshot(runner, runner.iter + 1)
        self.recovery.after_iteration(runner)
        self.publish(runner)

    def enforce_backoff(self, runner) -> None:
        """Right before the step: see :meth:`Recovery.enforce_backoff`."""
        self.recovery.enforce_backoff(runner)

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
        params_check = started(self.step_guard, 'the step guard').params_check
        iteration = params_check.pending
        read = params_check.read_now()
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
        checkpoint['nanguard'] = self.state_dict()
        self.recovery.checkpoint_written(
            checkpoint.get('meta', {}).get('iter', -1)
        )

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
        counters = checked_counters(state.get('counters', {}))
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
            self.recovery.source() is not None,
        )
        if kind.is_veto and verdict is not None:
            vetoed = '; '.join(s.describe() for s in verdict.spikes)
            reason = f'{vetoed or verdict.veto}; {reason}'
        self.history.mark_last('spike' if kind.is_veto else 'incident')
        iteration = bad_iteration(kind, verdict, runner.iter)
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
                started(self.step_guard, 'the step guard').named_params,
                self.settings.top_k_grads,
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
        event = IncidentEvent(
            report=report,
            folder=None,
            data_batch=trace.data_batch,
            rng_state=trace.rng_state,
            snapshots=tuple(self.snapshots),
        )
        turn = ListenersTurn(runner, event, self.listeners)
        force = action is IncidentAction.RAISE
        turn.finish(self._write(report, trace, iteration, force, turn))
        self.last_report = report
        message = describe(report)
        runner.logger.error(f'nanguard: {message}')
        if action is IncidentAction.RAISE:
            self._raise(runner, kind, message)
        if action is IncidentAction.ROLLBACK:
            self.recovery.rollback(runner)
            self.consecutive_skips = 0
        else:
            self.consecutive_skips += 1
            spike = self.settings.spike
            if kind.is_spike and spike is not None and spike.backoff:
                changes = self.recovery.back_off(runner)
                runner.logger.warning(
                    'nanguard: spike skipped; learning rates x'
                    f'{self.settings.lr_backoff} (now '
                    f'x{self.lr_backoff.multiplier:.3g} of the schedule): '
                    f'{describe_lr_pairs(changes)}'
                    f'{self.recovery.ramp_note()}'
                )

    def _write(self, report, trace, iteration, force, fill) -> Optional[str]:
        batch = None
        if self.settings.save_batch:
            batch = dict(
                data_batch=trace.data_batch,
                rng_state=trace.rng_state,
                iteration=iteration,
            )
        data = report.to_dict()
        recorder = started(self.recorder, 'the incident recorder')
        folder = recorder.record(data, batch, force=force, fill=fill)
        report.report_path = data.get('report_path')
        report.write_error = data.get('write_error')
        return folder

    def _raise(self, runner, kind: IncidentKind, message: str) -> None:
        self.publish(runner)
        if kind.weights_damaged:
            # the step already made the weights non-finite: leave the last
            # known-good ones in memory before stopping
            message += self.recovery.restore_before_stop(runner)
        fix = stop_fix(runner, self.last_report)
        if fix:
            message += f'; the fix: {fix}'
        error = NonFiniteTrainingError
        if kind.is_spike:
            error = TrainingSpikeError
        elif kind is IncidentKind.NONFINITE_CHECKPOINT:
            error = PoisonedCheckpointError
        raise error(f'nanguard stopped training: {message}')
