# Copyright (c) mmnanguard contributors. All rights reserved.
"""NanGuardHook: no non-finite value reaches the weights or a checkpoint."""
import glob
import os.path as osp
from collections import deque
from typing import Any, Dict, Optional, Sequence, Tuple

from mmengine.dist import get_rank, get_world_size
from mmengine.hooks import Hook
from mmengine.runner.checkpoint import weights_to_cpu
from mmengine.utils import apply_to

from mmnanguard.registry import HOOKS, register_shared
from ..guard import (GuardSettings, IncidentRecorder, IterationHistory,
                     IterationRecord, NonFiniteTrainingError,
                     PoisonedCheckpointError, StepGuard, TrainingSnapshot)
from ..guard.distributed import any_rank
from ..guard.finite import nonfinite_paths, optimizer_params, total_norm
from ..guard.lr_backoff import scale_learning_rates
from ..guard.report import build_report, describe, loss_terms_of
from ..guard.rng import capture_rng_state
from ..guard.snapshot import scheduler_states, unwrap_model
from ..optimizers import install_step_guard, optim_wrapper_members

DATA_BATCH = Optional[Any]

#: Counters published through the MessageHub as ``train/nanguard_<name>``
#: and saved in checkpoints under ``nanguard``. None contains ``loss``,
#: ``time`` or ``grad_norm``: ``LogProcessor`` would average those over its
#: window instead of showing the current count.
COUNTERS = ('incidents', 'skipped', 'rollbacks', 'nonfinite_objective',
            'nonfinite_grad', 'nonfinite_params', 'poisoned_checkpoints',
            'amp_skipped')

#: incident kind -> the counter it increments.
KIND_COUNTER = dict(
    nonfinite_loss='nonfinite_objective',
    nonfinite_grad='nonfinite_grad',
    nonfinite_params='nonfinite_params',
    nonfinite_checkpoint='poisoned_checkpoints')


@register_shared(HOOKS)
class NanGuardHook(Hook):
    """Check every iteration, before the optimizer touches the weights.

    Each iteration the hook's step guard (installed into the runner's optim
    wrapper, each member of an ``OptimWrapperDict`` included) checks

    * the total loss, before backward: a non-finite loss skips backward;
    * the global gradient norm, before the step: ``clip_grad``'s own norm
      when configured, else one fused pass; a non-finite norm drops the
      step and zeroes the gradients. Under ``AmpOptimWrapper`` the
      GradScaler's skips are counted, not handled twice;
    * after the step, every ``param_check_interval`` iterations, that the
      parameters are still finite (optimizer-state blow-ups);
    * before each checkpoint is written, that its model and optimizer
      states are finite. A poisoned checkpoint is never written.

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
            ``save_batch``, ``top_k_grads``, ``history_size``).

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
        self.snapshots: deque = deque(maxlen=self.settings.keep_snapshots)
        self._newest_snapshot_tried = False
        self.last_good_checkpoint: Optional[str] = None
        self.consecutive_skips = 0
        self.last_report: Optional[Dict[str, Any]] = None
        self._data_batch: DATA_BATCH = None
        self._rng_state: Optional[Dict[str, Any]] = None

    # -- stages -----------------------------------------------------------
    def before_train(self, runner) -> None:
        """Install the step guard and take the first snapshot."""
        model = unwrap_model(runner.model)
        names = {id(p): n for n, p in model.named_parameters()}
        self.step_guard = StepGuard(names, self.settings.top_k_grads)
        install_step_guard(runner.optim_wrapper, self.step_guard)
        self.recorder = IncidentRecorder(runner.work_dir,
                                         self.settings.max_incidents,
                                         get_rank(), get_world_size())
        self.recorder.written = len(
            glob.glob(osp.join(self.recorder.root, 'incident_*')))
        if self._uses_snapshots():
            self._take_snapshot(runner, iteration=runner.iter)
        runner.logger.info(f'NanGuard active: {self.settings.to_dict()}')

    def before_train_iter(self,
                          runner,
                          batch_idx: int,
                          data_batch: DATA_BATCH = None) -> None:
        """Keep a reference to the batch and the RNG states (no copies)."""
        self.step_guard.begin_iteration()
        self._data_batch = data_batch
        if self.settings.save_batch:
            self._rng_state = capture_rng_state()

    def after_train_iter(self,
                         runner,
                         batch_idx: int,
                         data_batch: DATA_BATCH = None,
                         outputs: Optional[dict] = None) -> None:
        """Check the parameters, then act on what the step guard saw."""
        record = self.step_guard.record
        terms = loss_terms_of(outputs)
        kind = None
        if record.loss_nonfinite:
            kind = 'nonfinite_loss'
        elif record.grad_nonfinite:
            kind = 'nonfinite_grad'
        elif self._param_check_due(runner, record) and \
                not self._params_finite(runner):
            kind = 'nonfinite_params'
        self.counters['skipped'] += record.skipped_steps
        self.counters['amp_skipped'] += record.amp_skipped_steps
        self.history.append(runner.iter, terms, record.grad_norm,
                            self._first_lr(runner), record.loss_scale)
        if kind is not None:
            self._on_incident(runner, kind, terms, record)
        elif record.steps:
            self.consecutive_skips = 0
            if self._uses_snapshots() and \
                    (runner.iter + 1) % self.settings.snapshot_interval == 0:
                self._take_snapshot(runner, iteration=runner.iter + 1)
        self._publish(runner)

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        """Refuse to write non-finite state; store the counters."""
        bad = nonfinite_paths(
            dict(
                state_dict=checkpoint.get('state_dict'),
                optimizer=checkpoint.get('optimizer')))
        if bad:
            record = self.step_guard.record if self.step_guard else \
                IterationRecord()
            self._on_incident(
                runner,
                'nonfinite_checkpoint',
                {},
                record,
                extra=dict(nonfinite_tensors=bad[:50]),
                error_cls=PoisonedCheckpointError)
            self._refill_checkpoint(runner, checkpoint)
        self.last_good_checkpoint = runner.message_hub.get_info('last_ckpt')
        checkpoint['nanguard'] = dict(counters=dict(self.counters))

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        """Restore the counters saved by :meth:`before_save_checkpoint`."""
        saved = checkpoint.get('nanguard', {}).get('counters', {})
        for name in COUNTERS:
            self.counters[name] = int(saved.get(name, self.counters[name]))

    def after_train(self, runner) -> None:
        """Log a one-line summary of the run."""
        runner.logger.info(f'NanGuard summary: {self.counters}')

    # -- decisions --------------------------------------------------------
    def _uses_snapshots(self) -> bool:
        s = self.settings
        return s.policy == 'rollback' or (s.policy == 'skip'
                                          and s.escalate_to == 'rollback')

    def _param_check_due(self, runner, record: IterationRecord) -> bool:
        interval = self.settings.param_check_interval
        return interval > 0 and record.steps > 0 and \
            (runner.iter + 1) % interval == 0

    def _params_finite(self, runner) -> bool:
        params = [
            p for w in optim_wrapper_members(runner.optim_wrapper)
            for p in optimizer_params(w.optimizer)
        ]
        local_bad = not bool(total_norm(params).isfinite())
        return not any_rank(local_bad)

    def _decide(self, kind: str) -> Tuple[str, str]:
        s = self.settings
        if s.policy == 'raise':
            return 'raise', 'policy=raise'
        if s.policy == 'rollback':
            action, reason = 'rollback', 'policy=rollback'
        elif kind in ('nonfinite_params', 'nonfinite_checkpoint'):
            action = s.escalate_to
            reason = ('the parameters are already non-finite, a skip cannot '
                      f'undo the step: escalate_to={s.escalate_to}')
        elif self.consecutive_skips >= s.max_consecutive_skips:
            action = s.escalate_to
            reason = (f'{self.consecutive_skips} consecutive skips reached '
                      f'max_consecutive_skips={s.max_consecutive_skips}: '
                      f'escalate_to={s.escalate_to}')
        else:
            return 'skip', 'policy=skip'
        if action == 'rollback':
            if self.counters['rollbacks'] >= s.max_rollbacks:
                return 'raise', (f'{reason}, but max_rollbacks='
                                 f'{s.max_rollbacks} rollbacks are spent')
            if self._rollback_source() is None:
                return 'raise', f'{reason}, but no known-good state exists'
        return action, reason

    def _on_incident(self,
                     runner,
                     kind: str,
                     terms: Dict[str, float],
                     record: IterationRecord,
                     extra: Optional[Dict[str, Any]] = None,
                     error_cls: type = NonFiniteTrainingError) -> None:
        index = self.counters['incidents']
        self.counters['incidents'] += 1
        self.counters[KIND_COUNTER[kind]] += 1
        action, reason = self._decide(kind)
        self.history.mark_last('incident')
        report = build_report(
            runner=runner,
            kind=kind,
            action=action,
            reason=reason,
            terms=terms,
            record=record,
            data_batch=self._data_batch,
            local_fault=record.local_loss_nonfinite
            or record.local_grad_nonfinite or kind.endswith('params'),
            history=self.history.to_list(),
            extra=extra)
        batch = None
        if self.settings.save_batch:
            batch = dict(
                data_batch=self._data_batch,
                rng_state=self._rng_state,
                iteration=runner.iter)
        self.recorder.record(index, report, batch)
        self.last_report = report
        message = describe(report)
        runner.logger.error(f'NanGuard: {message}')
        if action == 'raise':
            self._publish(runner)
            raise error_cls(f'NanGuard stopped training: {message}')
        if action == 'rollback':
            self._rollback(runner)
        else:
            self.consecutive_skips += 1

    # -- state ------------------------------------------------------------
    def _rollback_source(self) -> Optional[str]:
        if (self.settings.rollback_source == 'checkpoint'
                and self.last_good_checkpoint
                and osp.isfile(self.last_good_checkpoint)):
            return self.last_good_checkpoint
        return 'memory' if self.snapshots else None

    def _take_snapshot(self, runner, iteration: int) -> None:
        """Snapshot the state in which iteration ``iteration`` starts."""
        if not self._params_finite(runner):
            runner.logger.warning(
                'NanGuard: parameters are non-finite, no snapshot taken')
            return
        snapshot = TrainingSnapshot.capture(runner)
        snapshot.iteration = iteration
        self.snapshots.append(snapshot)
        self._newest_snapshot_tried = False

    def _snapshot_for_rollback(self) -> TrainingSnapshot:
        if self._newest_snapshot_tried and len(self.snapshots) > 1:
            self.snapshots.pop()  # restoring it did not help: go further
        self._newest_snapshot_tried = True
        return self.snapshots[-1]

    def _rollback(self, runner) -> None:
        source = self._rollback_source()
        state = self._snapshot_for_rollback() if source == 'memory' else \
            TrainingSnapshot.from_checkpoint(runner, source)
        state.restore(runner)
        for wrapper in optim_wrapper_members(runner.optim_wrapper):
            wrapper.optimizer.zero_grad(set_to_none=True)
            wrapper._nanguard_poisoned = False
        changes = scale_learning_rates(runner.optim_wrapper,
                                       self.settings.lr_backoff)
        self.counters['rollbacks'] += 1
        self.consecutive_skips = 0
        runner.logger.warning(
            f'NanGuard: rolled back to the state of iteration '
            f'{state.iteration} (from {state.source}); learning rates x'
            f'{self.settings.lr_backoff}: '
            f'{[f"{a:.3g}->{b:.3g}" for a, b in changes]}; rollback '
            f"{self.counters['rollbacks']}/{self.settings.max_rollbacks}")

    def _refill_checkpoint(self, runner, checkpoint: dict) -> None:
        """After a rollback, write the restored state instead."""
        checkpoint['state_dict'] = weights_to_cpu(
            unwrap_model(runner.model).state_dict())
        if 'optimizer' in checkpoint:
            checkpoint['optimizer'] = apply_to(
                runner.optim_wrapper.state_dict(),
                lambda x: hasattr(x, 'cpu'), lambda x: x.cpu())
        if 'param_schedulers' in checkpoint:
            checkpoint['param_schedulers'] = scheduler_states(runner)

    @staticmethod
    def _first_lr(runner) -> Optional[float]:
        lrs: Sequence = next(iter(runner.optim_wrapper.get_lr().values()),
                             [])
        return float(lrs[0]) if len(lrs) else None

    def _publish(self, runner) -> None:
        for name, value in self.counters.items():
            runner.message_hub.update_scalar(f'train/nanguard_{name}', value)
