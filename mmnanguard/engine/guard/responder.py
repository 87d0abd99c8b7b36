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
from .lr_backoff import LrBackoff
from .optim_members import optim_wrapper_members
from .policy import decide_action
from .report import build_report
from .scheduled_lr import ScheduledLr
from .settings import GuardSettings
from .snapshot import TrainingSnapshot, write_runner_state
from .snapshot_store import SnapshotStore
from .spike_detector import SpikeDetector, spikes_as_dicts
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
        self._base_lr: Optional[float] = None
        self._ckpt_lr_multipliers: Dict[int, float] = {}

    # -- lifecycle -----------------------------------------------------------
    def start(self, runner, step_guard: StepGuard, recorder) -> None:
        """Before training: take the first snapshot (its parameters are
        checked with the first step's read)."""
        self.step_guard = step_guard
        self.recorder = recorder
        self._work_dir = runner.work_dir
        self._base_lr = first_lr(runner)
        self.snapshots.add(TrainingSnapshot.capture(runner), pending=True)
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
            first_lr(runner),
            outcome.loss_scale(),
            lr_scheduled=self.scheduled_lr.read(
                runner, self._base_lr, self.lr_backoff.multiplier
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
        self.publish(runner)

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
        finite = self.step_guard.flush()
        self.snapshots.confirm(finite)
        if finite is False:
            verdict = StepVerdict(
                iteration=runner.iter,
                params_finite=False,
                params_iteration=iteration,
                local_params_finite=False,
            )
            self._incident(
                runner, IncidentKind.NONFINITE_PARAMS, verdict, traces
            )
            return True
        return False

    def check_checkpoint(
        self, runner, checkpoint: dict, traces: Dict[int, Any]
    ) -> None:
        """Refuse to write non-finite state; store the guard's state."""
        if self.step_guard is not None and self.check_pending_params(
            runner, traces
        ):
            write_runner_state(runner, checkpoint)  # the restored state
        bad = nonfinite_paths(
            dict(
                state_dict=checkpoint.get('state_dict'),
                optimizer=checkpoint.get('optimizer'),
            )
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

    def state_dict(self) -> Dict[str, Any]:
        """Counters, lr backoff and spike statistics, for checkpoints."""
        detector = self.spike_detector
        return dict(
            counters=dict(self.counters),
            lr_backoff=self.lr_backoff.state_dict(),
            spike=detector.state_dict() if detector else None,
        )

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        saved = state.get('counters', {})
        for name in COUNTERS:
            self.counters[name] = int(saved.get(name, self.counters[name]))
        if 'lr_backoff' in state:
            self.lr_backoff.load_state_dict(state['lr_backoff'])
        if self.spike_detector is not None and state.get('spike'):
            self.spike_detector.load_state_dict(state['spike'])

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
                    f'{self.settings.lr_backoff}: {_lr_changes(changes)}'
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
            if state is None:
                runner.logger.warning(
                    'nanguard: no complete checkpoint that loads (and was '
                    'not restored already) is in '
                    f'{self._work_dir}; rolling back to the in-memory '
                    'snapshot'
                )
        if state is None:
            state = self.snapshots.for_rollback()
        state.restore(runner)
        self.last_restored = state
        self.snapshots.pending = None
        self.step_guard.forget_pending()
        for wrapper in optim_wrapper_members(runner.optim_wrapper):
            wrapper.optimizer.zero_grad(set_to_none=True)
        # the restored lrs carry the multiplier of the restored state
        self.lr_backoff.restored(
            getattr(state, 'lr_multiplier', None)
            or self._ckpt_lr_multipliers.get(
                state.iteration, self.lr_backoff.multiplier
            )
        )
        changes = self._back_off(runner)
        self.counters['rollbacks'] += 1
        self.consecutive_skips = 0
        runner.logger.warning(
            f'nanguard: rolled back to the state of iteration '
            f'{state.iteration} (from {state.source}); learning rates x'
            f'{self.settings.lr_backoff}: '
            f'{_lr_changes(changes)}; rollback '
            f"{self.counters['rollbacks']}/{self.settings.max_rollbacks}"
            f'{self._ramp_note()}'
        )

    def _back_off(self, runner) -> List[Tuple[float, float]]:
        self.counters['lr_backoffs'] += 1
        return self.lr_backoff.back_off(runner.optim_wrapper, runner.iter)

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


def first_lr(runner) -> Optional[float]:
    """The live lr of the first param group (``get_lr()['lr'][0]``; its
    ``base_lr`` entry, where present, is not the live value)."""
    lrs = runner.optim_wrapper.get_lr()
    if hasattr(lrs, 'get') and 'lr' in lrs:
        values = lrs['lr']
    else:  # OptimWrapperDict: 'name.lr' keys
        values = next(
            (
                v
                for k, v in lrs.items()
                if k.endswith('lr') and 'base' not in k
            ),
            [],
        )
    return float(values[0]) if len(values) else None


def _lr_changes(changes: List[Tuple[float, float]]) -> List[str]:
    return [f'{a:.3g}->{b:.3g}' for a, b in changes]
