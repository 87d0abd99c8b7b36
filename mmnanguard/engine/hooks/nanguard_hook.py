# Copyright (c) mmnanguard contributors. All rights reserved.
"""NanGuardHook: no non-finite value reaches the weights or a checkpoint."""

import glob
import os.path as osp
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from mmengine.dist import get_rank, get_world_size
from mmengine.hooks import Hook
from mmengine.optim import AmpOptimWrapper

from mmnanguard.registry import HOOKS, register_shared

from ..guard import (
    GuardSettings,
    IncidentRecorder,
    IterationHistory,
    IterationRecord,
    NonFiniteTrainingError,
    PoisonedCheckpointError,
    StepGuard,
    TrainingSnapshot,
)
from ..guard.distributed import any_rank
from ..guard.exceptions import TrainingSpikeError
from ..guard.finite import nonfinite_paths, optimizer_params, total_norm
from ..guard.input_check import capture_input_finiteness
from ..guard.loss_terms import capture_loss_terms
from ..guard.lr_backoff import LrBackoff, non_chaining_schedulers
from ..guard.policy import PARAM_KINDS, VETO_KINDS, decide_action
from ..guard.report import build_report, describe, loss_terms_of
from ..guard.rng import capture_rng_state
from ..guard.scheduled_lr import ScheduledLr
from ..guard.snapshot import unwrap_model, write_runner_state
from ..guard.snapshot_store import SnapshotStore
from ..guard.spike_detector import SpikeDetector
from ..guard.stage import live_stage
from ..optimizers import install_step_guard, optim_wrapper_members

DATA_BATCH = Optional[Any]

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

#: incident kind -> the counter it increments.
KIND_COUNTER = dict(
    nonfinite_loss='nonfinite_objective',
    nonfinite_grad='nonfinite_grad',
    nonfinite_params='nonfinite_params',
    nonfinite_checkpoint='poisoned_checkpoints',
    loss_spike='spikes',
    grad_spike='spikes',
    vetoed_update='vetoed',
)

#: ``record.veto_stage`` -> incident kind of a spike veto.
SPIKE_KINDS = dict(loss='loss_spike', grad='grad_spike')


@register_shared(HOOKS)
class NanGuardHook(Hook):
    """Check every iteration, before the optimizer touches the weights.

    Each iteration the hook's step guard (installed into the runner's optim
    wrapper, each member of an ``OptimWrapperDict`` included) checks

    * the total loss, before backward: a non-finite loss skips backward;
      in the same host transfer, whether the inputs and boxes after the
      data preprocessor were finite (the ``stage`` of an incident, see
      :mod:`~mmnanguard.engine.guard.stage`);
    * the global gradient norm, before the step: ``clip_grad``'s own norm
      when configured, else one fused pass; a non-finite norm drops the
      step and zeroes the gradients. Under ``AmpOptimWrapper`` the
      GradScaler's skips are counted, not handled twice;
    * after the step, every ``param_check_interval`` iterations, that the
      parameters are still finite (optimizer-state blow-ups);
    * before each checkpoint is written, that its model and optimizer
      states are finite. A poisoned checkpoint is never written;
    * with ``spike=dict(...)``, the total loss, each loss term and the grad
      norm against a running max (:class:`SpikeDetector`); a spike is
      logged, skipped or rolled back (``spike.action``), and a skip or a
      rollback multiplies the learning rates by ``lr_backoff``, optionally
      ramped back over ``recover_iters`` (:class:`LrBackoff`).

    Ranks agree on every verdict (``all_reduce`` of a flag) before acting.
    Then the policy acts (see :class:`GuardSettings`), an incident folder
    with ``report.json`` and ``batch.pth`` is written under
    ``{work_dir}/nanguard/``, and the counters ``train/nanguard_*`` go
    through the MessageHub to the text log and the visualizer backends.

    Args:
        **settings: The fields of :class:`GuardSettings` (``policy``,
            ``max_consecutive_skips``, ``escalate_to``,
            ``snapshot_interval``, ``rollback_source``, ``lr_backoff``,
            ``max_rollbacks``, ``param_check_interval``, ``max_incidents``,
            ``save_batch``, ``top_k_grads``, ``history_size``,
            ``recover_iters``, ``spike``).

    Example:
        >>> custom_hooks = [dict(type='NanGuardHook', policy='rollback',
        ...                      lr_backoff=0.5, snapshot_interval=50)]
    """

    priority = 'ABOVE_NORMAL'  # before EMAHook, LoggerHook, CheckpointHook

    def __init__(self, **settings: Any) -> None:
        self.settings = GuardSettings.from_dict(settings)
        self.counters: Dict[str, int] = {k: 0 for k in COUNTERS}
        self.history = IterationHistory(self.settings.history_size)
        self.step_guard: Optional[StepGuard] = None
        self.recorder: Optional[IncidentRecorder] = None
        self.snapshots = SnapshotStore(self.settings.keep_snapshots)
        self.last_good_checkpoint: Optional[str] = None
        self.consecutive_skips = 0
        self.last_report: Optional[Dict[str, Any]] = None
        #: The snapshot the last rollback (or raise) restored.
        self.last_restored: Optional[TrainingSnapshot] = None
        self.scheduled_lr = ScheduledLr()
        self._base_lr: Optional[float] = None
        self._data_batch: DATA_BATCH = None
        self._rng_state: Optional[Dict[str, Any]] = None
        #: Called as ``listener(runner, report, folder)`` after an incident
        #: is written and before the policy acts (diagnosis plugs in here).
        self.incident_listeners: List[Callable] = []
        self.lr_backoff = LrBackoff(
            self.settings.lr_backoff, self.settings.recover_iters
        )
        self._ckpt_lr_multipliers: Dict[int, float] = {}
        self.spike_detector: Optional[SpikeDetector] = None
        if self.settings.spike is not None:
            self.spike_detector = SpikeDetector(self.settings.spike)

    # -- stages -----------------------------------------------------------
    def before_train(self, runner) -> None:
        """Install the step guard and take the first snapshot."""
        model = unwrap_model(runner.model)
        names = {id(p): n for n, p in model.named_parameters()}
        self.step_guard = StepGuard(names, self.settings.top_k_grads)
        install_step_guard(runner.optim_wrapper, self.step_guard)
        capture_loss_terms(model, self.step_guard)
        capture_input_finiteness(runner.model, self.step_guard)
        self._base_lr = self._first_lr(runner)
        if self.spike_detector is not None:
            self._install_spike_detector(runner)
        for name in non_chaining_schedulers(runner):
            runner.logger.warning(
                f'NanGuard: {name} recomputes the lr from its stored values: '
                'it discards an lr backoff at its next step'
            )
        self.recorder = IncidentRecorder(
            runner.work_dir,
            self.settings.max_incidents,
            get_rank(),
            get_world_size(),
        )
        self.recorder.written = len(
            glob.glob(osp.join(self.recorder.root, 'incident_*'))
        )
        # snapshots serve rollback, raise (the weights left in memory after
        # a step that made them non-finite) and the diagnosis replay
        self._take_snapshot(runner, iteration=runner.iter)
        runner.logger.info(f'NanGuard active: {self.settings.to_dict()}')

    def before_train_iter(
        self, runner, batch_idx: int, data_batch: DATA_BATCH = None
    ) -> None:
        """Keep a reference to the batch and the RNG states (no copies)."""
        self.step_guard.begin_iteration()
        if self.spike_detector is not None:
            self.spike_detector.begin_iteration()
        self._data_batch = data_batch
        if self.settings.save_batch:
            self._rng_state = capture_rng_state()

    def after_train_iter(
        self,
        runner,
        batch_idx: int,
        data_batch: DATA_BATCH = None,
        outputs: Optional[dict] = None,
    ) -> None:
        """Check the parameters, then act on what the step guard saw."""
        record = self.step_guard.record
        terms = loss_terms_of(outputs)
        kind = None
        params_checked = False
        if record.loss_nonfinite:
            kind = 'nonfinite_loss'
        elif record.grad_nonfinite:
            kind = 'nonfinite_grad'
        elif record.veto is not None:
            kind = (
                'vetoed_update'
                if self.spike_detector is None
                else SPIKE_KINDS[record.veto_stage]
            )
        elif self._param_check_due(runner, record):
            params_checked = True
            if not self._params_finite(runner):
                kind = 'nonfinite_params'
        self.counters['skipped'] += record.skipped_steps
        self.counters['amp_skipped'] += record.amp_skipped_steps
        self.history.append(
            runner.iter,
            terms,
            record.grad_norm,
            self._first_lr(runner),
            record.loss_scale,
            lr_scheduled=self.scheduled_lr.read(
                runner, self._base_lr, self.lr_backoff.multiplier
            ),
        )
        spikes = self.spike_detector.detections if self.spike_detector else []
        if spikes and record.veto is None:  # action='log'
            self.counters['spikes'] += 1
            self.history.mark_last('spike')
            runner.logger.warning(
                f'NanGuard: spike at iteration {runner.iter} (logged '
                f'only, spike.action=log): {self.spike_detector.describe()}'
            )
        if kind is not None:
            self._on_incident(
                runner,
                kind,
                terms,
                record,
                extra=dict(spikes=self.spike_detector.detections_as_dicts())
                if kind in SPIKE_KINDS.values()
                else None,
                error_cls=TrainingSpikeError
                if kind in SPIKE_KINDS.values()
                else NonFiniteTrainingError,
            )
        elif record.steps:
            self.consecutive_skips = 0
            if (runner.iter + 1) % self.settings.snapshot_interval == 0:
                self._take_snapshot(
                    runner, runner.iter + 1, params_checked=params_checked
                )
        if self.lr_backoff.step(runner.optim_wrapper, runner.iter) == 1.0:
            runner.logger.info(
                f'NanGuard: learning rates back on the schedule after '
                f'iteration {runner.iter} (recover_iters='
                f'{self.settings.recover_iters})'
            )
        self._publish(runner)

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        """Refuse to write non-finite state; store the counters."""
        bad = nonfinite_paths(
            dict(
                state_dict=checkpoint.get('state_dict'),
                optimizer=checkpoint.get('optimizer'),
            )
        )
        if bad:
            record = (
                self.step_guard.record
                if self.step_guard
                else IterationRecord()
            )
            self._on_incident(
                runner,
                'nonfinite_checkpoint',
                {},
                record,
                extra=dict(nonfinite_tensors=bad[:50]),
                error_cls=PoisonedCheckpointError,
            )
            write_runner_state(runner, checkpoint)  # the restored state
        self.last_good_checkpoint = runner.message_hub.get_info('last_ckpt')
        checkpoint['nanguard'] = dict(
            counters=dict(self.counters),
            lr_backoff=self.lr_backoff.state_dict(),
            spike=self.spike_detector.state_dict()
            if self.spike_detector
            else None,
        )
        self._ckpt_lr_multipliers[
            checkpoint.get('meta', {}).get('iter', -1)
        ] = self.lr_backoff.multiplier

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        """Restore the counters saved by :meth:`before_save_checkpoint`."""
        state = checkpoint.get('nanguard', {})
        saved = state.get('counters', {})
        for name in COUNTERS:
            self.counters[name] = int(saved.get(name, self.counters[name]))
        if 'lr_backoff' in state:
            self.lr_backoff.load_state_dict(state['lr_backoff'])
        if self.spike_detector is not None and state.get('spike'):
            self.spike_detector.load_state_dict(state['spike'])

    def after_train(self, runner) -> None:
        """Log a one-line summary of the run."""
        runner.logger.info(f'NanGuard summary: {self.counters}')

    # -- decisions --------------------------------------------------------
    def _install_spike_detector(self, runner) -> None:
        detector = self.spike_detector
        self.step_guard.loss_vetoes.append(detector.loss_veto)
        if not detector.settings.grad_norm:
            return
        self.step_guard.grad_vetoes.append(detector.grad_veto)
        amp = [
            type(w).__name__
            for w in optim_wrapper_members(runner.optim_wrapper)
            if isinstance(w, AmpOptimWrapper)
        ]
        if amp:
            runner.logger.warning(
                f'NanGuard: grad_norm spikes are not checked for {amp}: '
                'under AMP the GradScaler owns the gradients; loss spikes '
                'are checked'
            )

    def _param_check_due(self, runner, record: IterationRecord) -> bool:
        interval = self.settings.param_check_interval
        return (
            interval > 0
            and record.steps > 0
            and (runner.iter + 1) % interval == 0
        )

    def _params_finite(self, runner) -> bool:
        params = [
            p
            for w in optim_wrapper_members(runner.optim_wrapper)
            for p in optimizer_params(w.optimizer)
        ]
        local_bad = not bool(total_norm(params).isfinite())
        return not any_rank(local_bad)

    def _decide(self, kind: str) -> Tuple[str, str]:
        return decide_action(
            self.settings,
            kind,
            self.consecutive_skips,
            self.counters['rollbacks'],
            self._rollback_source() is not None,
        )

    def _on_incident(
        self,
        runner,
        kind: str,
        terms: Dict[str, float],
        record: IterationRecord,
        extra: Optional[Dict[str, Any]] = None,
        error_cls: type = NonFiniteTrainingError,
    ) -> None:
        index = self.counters['incidents']
        self.counters['incidents'] += 1
        self.counters[KIND_COUNTER[kind]] += 1
        action, reason = self._decide(kind)
        if kind in VETO_KINDS:
            reason = f'{record.veto}; {reason}'
        self.history.mark_last(
            'spike' if kind in SPIKE_KINDS.values() else 'incident'
        )
        report = build_report(
            runner=runner,
            kind=kind,
            action=action,
            reason=reason,
            terms=terms,
            record=record,
            data_batch=self._data_batch,
            local_fault=record.local_loss_nonfinite
            or record.local_grad_nonfinite
            or kind.endswith('params')
            or bool(extra and extra.get('spikes')),
            history=self.history.to_list(),
            stage=live_stage(kind, record),
            extra=extra,
        )
        batch = None
        if self.settings.save_batch:
            batch = dict(
                data_batch=self._data_batch,
                rng_state=self._rng_state,
                iteration=runner.iter,
            )
        folder = self.recorder.record(index, report, batch)
        self.last_report = report
        for listener in self.incident_listeners:
            listener(runner, report, folder)
        message = describe(report)
        runner.logger.error(f'NanGuard: {message}')
        if action == 'raise':
            self._publish(runner)
            if kind in PARAM_KINDS and self.snapshots.newest is not None:
                # the step already made the weights non-finite: leave the
                # last known-good ones in memory before stopping
                self.snapshots.newest.restore(runner)
                self.last_restored = self.snapshots.newest
                message += (
                    '; the weights in memory were restored to iteration '
                    f'{self.snapshots.newest.iteration}'
                )
            raise error_cls(f'NanGuard stopped training: {message}')
        if action == 'rollback':
            self._rollback(runner)
        else:
            self.consecutive_skips += 1
            if kind in SPIKE_KINDS.values() and self.settings.spike.backoff:
                changes = self._back_off(runner)
                runner.logger.warning(
                    f'NanGuard: spike skipped; learning rates x'
                    f'{self.settings.lr_backoff}: {_lr_changes(changes)}'
                    f'{self._ramp_note()}'
                )

    # -- state ------------------------------------------------------------
    def _rollback_source(self) -> Optional[str]:
        if (
            self.settings.rollback_source == 'checkpoint'
            and self.last_good_checkpoint
            and osp.isfile(self.last_good_checkpoint)
        ):
            return self.last_good_checkpoint
        return 'memory' if self.snapshots else None

    def _take_snapshot(
        self, runner, iteration: int, params_checked: bool = False
    ) -> None:
        """Snapshot the state in which iteration ``iteration`` starts
        (``params_checked``: this iteration's parameter check passed, so no
        second pass over the parameters is needed)."""
        if not params_checked and not self._params_finite(runner):
            runner.logger.warning(
                'NanGuard: parameters are non-finite, no snapshot taken'
            )
            return
        snapshot = TrainingSnapshot.capture(runner)
        snapshot.iteration = iteration
        snapshot.lr_multiplier = self.lr_backoff.multiplier
        self.snapshots.add(snapshot)

    def _rollback(self, runner) -> None:
        source = self._rollback_source()
        state = (
            self.snapshots.for_rollback()
            if source == 'memory'
            else TrainingSnapshot.from_checkpoint(runner, source)
        )
        state.restore(runner)
        self.last_restored = state
        for wrapper in optim_wrapper_members(runner.optim_wrapper):
            wrapper.optimizer.zero_grad(set_to_none=True)
            wrapper._nanguard_poisoned = False
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
            f'NanGuard: rolled back to the state of iteration '
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
    def _first_lr(runner) -> Optional[float]:
        lrs: Sequence = next(iter(runner.optim_wrapper.get_lr().values()), [])
        return float(lrs[0]) if len(lrs) else None

    def _publish(self, runner) -> None:
        for name, value in self.counters.items():
            runner.message_hub.update_scalar(f'train/nanguard_{name}', value)
        runner.message_hub.update_scalar(
            'train/nanguard_lr_factor', self.lr_backoff.multiplier
        )


def _lr_changes(changes: List[Tuple[float, float]]) -> List[str]:
    return [f'{a:.3g}->{b:.3g}' for a, b in changes]
