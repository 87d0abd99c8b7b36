# Copyright (c) mmnanguard contributors. All rights reserved.
"""NanGuardHook: no non-finite value reaches the weights or a checkpoint."""

import os.path as osp
from typing import Any, Dict, Optional

from mmengine.dist import get_rank, get_world_size, is_main_process
from mmengine.hooks import Hook
from mmengine.optim import AmpOptimWrapper

from mmnanguard.registry import HOOKS, register_shared

from ..guard import GuardSettings, StepGuard
from ..guard.checkpoint_layout import ShardedCheckpointError, one_rank_shards
from ..guard.dropped_step_scalars import DroppedStepScalars
from ..guard.incident_event import IterationTrace, Listener
from ..guard.input_check import capture_input_finiteness
from ..guard.loss_terms import capture_loss_terms
from ..guard.lr_backoff import lr_setting_hooks, non_chaining_schedulers
from ..guard.optim_members import optim_wrapper_members
from ..guard.rank_agreement import is_distributed
from ..guard.report import train_ann_file
from ..guard.responder import GuardResponder
from ..guard.rng import capture_rng_state
from ..guard.save_agreement import agree_around_saves, agree_before_save
from ..guard.snapshot import unwrap_model
from ..guard.started import started
from ..incident import IncidentRecorder, mark_discarded
from ..optimizers import install_step_guard
from ..resume import ExactResume
from .numerical_errors import NumericalErrors

DATA_BATCH = Optional[Any]


class LrBackoffEnforcer(Hook):
    """The guard's last word before the step: registered by
    :class:`NanGuardHook` with priority ``LOWEST`` after every other hook,
    its ``before_train_iter`` runs after every hook that sets the lr and
    gives an lr backoff back to the lrs they reset
    (:meth:`GuardResponder.enforce_backoff`).

    Args:
        responder (GuardResponder): The guard's responder.
    """

    priority = 'LOWEST'

    def __init__(self, responder: GuardResponder) -> None:
        self.responder = responder

    def before_train_iter(
        self, runner, batch_idx: int, data_batch: DATA_BATCH = None
    ) -> None:
        """Re-apply the lr backoff where a hook reset the lr."""
        self.responder.enforce_backoff(runner)


@register_shared(HOOKS)
class NanGuardHook(Hook):
    """Check every iteration, before the optimizer touches the weights.

    Every check of an iteration (the inputs after the data preprocessor,
    each loss term, the gradient norm before ``clip_grad`` scales it, the
    parameters after the previous step, the buffers the forward wrote, the
    spike detector)
    stays on the device until the optimizer is about to step; then the
    step guard reads them in **one** host read, which under ``clip_grad``
    is the read mmengine makes anyway to log the norm
    (:mod:`~mmnanguard.engine.guard.step_guard`). Under
    ``torch.distributed`` the ranks agree through one ``all_reduce`` of
    the deciding flags before that read. A bad verdict drops the step;
    the hook hands the iteration's outcome to its
    :class:`~mmnanguard.engine.guard.responder.GuardResponder`, which
    counts, writes the incident folder under ``{work_dir}/nanguard/``,
    emits an :class:`~mmnanguard.engine.guard.incident_event.IncidentEvent`
    to its listeners (:meth:`subscribe`; the diagnosis) and applies the
    policy (``skip``, ``rollback`` with an lr backoff, ``raise``). A
    :class:`LrBackoffEnforcer`, registered ``LOWEST`` after every other
    hook, keeps the backoff in effect under scheduler hooks that reset the
    lr from their own values (mmyolo's). Before
    each checkpoint is written, its model and optimizer states are checked
    (a poisoned checkpoint is never written). The counters
    ``train/nanguard_*`` go through the MessageHub to the text log and the
    visualizer backends, and are saved under the checkpoint key
    ``nanguard``.

    With ``NanGuardRunner`` (the include) the optim wrapper is built as a
    registered guarded wrapper. Added alone to a plain ``Runner``, the hook
    puts the guard in front of the built wrapper's class instead (logged).

    Args:
        **settings: The fields of :class:`GuardSettings` (``policy``,
            ``max_consecutive_skips``, ``escalate_to``,
            ``snapshot_interval``, ``keep_snapshots``, ``rollback_source``,
            ``lr_backoff``, ``max_rollbacks``, ``param_check_interval``,
            ``max_incidents``, ``save_batch``, ``top_k_grads``,
            ``history_size``, ``recover_iters``, ``spike``).

    Example:
        >>> custom_hooks = [dict(type='NanGuardHook', policy='rollback',
        ...                      lr_backoff=0.5, snapshot_interval=50)]
    """

    priority = 'ABOVE_NORMAL'  # before EMAHook, LoggerHook, CheckpointHook

    def __init__(self, **settings: Any) -> None:
        self.settings = GuardSettings.from_dict(settings)
        self.responder = GuardResponder(self.settings)
        self.step_guard: Optional[StepGuard] = None
        self._traces: Dict[int, IterationTrace] = {}
        self._enforcer = LrBackoffEnforcer(self.responder)
        self._dropped_scalars = DroppedStepScalars()
        self._save_agreed = False
        self._exact_resume = ExactResume()

    # -- what other hooks and tests read -----------------------------------
    @property
    def counters(self) -> Dict[str, int]:
        """``incidents``, ``skipped``, ``rollbacks``, ... of this run."""
        return self.responder.counters

    @property
    def history(self):
        """The ring buffer of recent iterations."""
        return self.responder.history

    @property
    def snapshots(self):
        """The confirmed known-good snapshots."""
        return self.responder.snapshots

    @property
    def last_report(self):
        """The report of the newest incident, or None."""
        return self.responder.last_report

    @property
    def last_restored(self):
        """The snapshot the last rollback (or raise) restored."""
        return self.responder.last_restored

    @property
    def lr_backoff(self):
        """The lr multiplier kept on top of the schedule."""
        return self.responder.lr_backoff

    @property
    def spike_detector(self):
        """The spike detector (None without ``spike``)."""
        return self.responder.spike_detector

    def subscribe(self, listener: Listener) -> None:
        """Call ``listener(runner, event)`` for every incident, while its
        folder is written (``batch.pth`` in it, ``report.json`` written
        after the listeners) and before the policy acts."""
        if listener not in self.responder.listeners:
            self.responder.listeners.append(listener)

    # -- stages -----------------------------------------------------------
    def before_train(self, runner) -> None:
        """Put the step guard into the optim wrapper and the model."""
        model = unwrap_model(runner.model)
        self.step_guard = StepGuard(
            {id(p): n for n, p in model.named_parameters()},
            buffers=dict(model.named_buffers()),
            top_k_grads=self.settings.top_k_grads,
            spike_detector=self.responder.spike_detector,
            param_check_interval=self.settings.param_check_interval,
        )
        self.step_guard.begin_iteration(runner.iter)
        swapped = install_step_guard(runner.optim_wrapper, self.step_guard)
        if swapped:
            runner.logger.info(
                f'nanguard: {swapped} guarded by a class swap (NanGuardHook '
                'was added alone; NanGuardRunner builds registered guarded '
                'optim wrappers instead)'
            )
        capture_loss_terms(model, self.step_guard)
        capture_input_finiteness(runner.model, self.step_guard)
        numerical = NumericalErrors(
            self.step_guard, model, train_ann_file(runner)
        )
        numerical.install(runner.model)
        self._warn_about_schedules(runner)
        if self._enforcer not in runner.hooks:
            # after every hook registered so far, LOWEST included
            runner.register_hook(self._enforcer, 'LOWEST')
        recorder = IncidentRecorder(
            runner.work_dir,
            self.settings.max_incidents,
            get_rank(),
            get_world_size(),
        )
        self.responder.start(runner, self.step_guard, recorder)
        if not getattr(runner, 'agrees_before_save', False):
            self._guard_alone(runner)
        runner.logger.info(f'nanguard active: {self.settings.to_dict()}')
        self._exact_resume.before_train(runner)

    def before_train_epoch(self, runner) -> None:
        """Count the trained batches of the epoch from 0."""
        self._exact_resume.epoch_started()

    def before_train_iter(
        self, runner, batch_idx: int, data_batch: DATA_BATCH = None
    ) -> None:
        """Start the iteration; keep a reference to its batch."""
        guard = started(self.step_guard, 'the step guard')
        guard.begin_iteration(runner.iter)
        guard.check_params_after_step = self.responder.snapshot_due(
            runner.iter
        )
        rng = capture_rng_state() if self.settings.save_batch else None
        self._traces[runner.iter] = IterationTrace(data_batch, rng)

    def after_train_iter(
        self,
        runner,
        batch_idx: int,
        data_batch: DATA_BATCH = None,
        outputs: Optional[dict] = None,
    ) -> None:
        """Hand the iteration's outcome to the responder; keep a dropped
        step's values out of the smoothed log (``DroppedStepScalars``)."""
        outcome = started(self.step_guard, 'the step guard').outcome
        self._exact_resume.iteration_done(batch_idx)
        try:
            self.responder.on_iteration(runner, outcome, self._traces)
        finally:
            if outcome.verdicts:  # keep this step's batch for its param check
                self._traces = {runner.iter: self._traces[runner.iter]}
        # a dropped step's loss and grad_norm leave the log's means
        self._dropped_scalars.after_iteration(runner, outcome, outputs)

    def agree_before_save(self, runner) -> bool:
        """Check the state about to be saved on every rank and handle a
        non-finite one on every rank (call it on every rank, before the
        master-only part of ``save_checkpoint``;
        :mod:`~mmnanguard.engine.guard.save_agreement`); then gather every
        rank's random generators for the resume record.

        Returns:
            bool: Whether an incident was handled.
        """
        self._save_agreed = True
        handled = agree_before_save(runner, self.responder, self._traces)
        self._exact_resume.gather_generators()
        return handled

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        """Refuse to write non-finite state; store the guard's state.

        Under ``torch.distributed`` this runs on rank 0 alone, so it makes
        no collective: the ranks agreed in :meth:`agree_before_save`."""
        agreed, self._save_agreed = self._save_agreed, False
        self.responder.check_checkpoint(
            runner,
            checkpoint,
            self._traces,
            alone=is_distributed() and not agreed,
        )
        self._exact_resume.record(runner, checkpoint)

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        """On resume: restore what :meth:`before_save_checkpoint` stored,
        and mark the incident folders of the iterations the resume
        discards (written after the checkpoint, before a crash).

        Raises:
            ShardedCheckpointError: The checkpoint holds one rank's DTensor
                shards (:func:`~..guard.checkpoint_layout.one_rank_shards`);
                nothing of it was taken yet.
        """
        sharded = one_rank_shards(checkpoint.get('state_dict'))
        if sharded is not None:
            raise ShardedCheckpointError(
                f'nanguard: refusing to load the checkpoint: {sharded}'
            )
        self.responder.load_state_dict(checkpoint.get('nanguard', {}))
        self._exact_resume.load(runner, checkpoint)
        iteration = checkpoint.get('meta', {}).get('iter')
        if isinstance(iteration, int) and is_main_process():
            marked = mark_discarded(
                osp.join(runner.work_dir, 'nanguard'), iteration
            )
            if marked:
                runner.logger.warning(
                    f'nanguard: resumed at iteration {iteration}; '
                    f'{len(marked)} incident folder(s) of the discarded '
                    f'part of the run are marked DISCARDED: {marked}'
                )

    def before_val(self, runner) -> None:
        """Keep the random generators: validation does not move the
        training's draws (:mod:`~..resume.exact_resume`)."""
        self._exact_resume.before_val()

    def after_val(self, runner) -> None:
        """Give the random generators back their state before validation."""
        self._exact_resume.after_val()

    def after_train(self, runner) -> None:
        """Read the last step's parameter check; log a summary."""
        if self.step_guard is not None:
            self.responder.check_pending_params(runner, self._traces)
        runner.logger.info(f'nanguard summary: {self.counters}')

    # -- helpers --------------------------------------------------------------
    def _guard_alone(self, runner) -> None:
        """Under a runner that is not a protected one: agree before each
        checkpoint on every rank, and say what the hook alone leaves out."""
        if is_distributed():
            agree_around_saves(runner, self.agree_before_save)
            runner.logger.info(
                'nanguard: the state is checked on every rank before each '
                'checkpoint (runner.save_checkpoint, which mmengine calls on '
                'every rank, agrees first; NanGuardHook was added alone)'
            )
        runner.logger.warning(
            f'nanguard: NanGuardHook alone under {type(runner).__name__} '
            'guards every step and the contents of every checkpoint; it '
            'does not write checkpoints durably, save one on SIGTERM or '
            'SIGINT, or resume from the newest complete one. For those, '
            "list 'mmnanguard::_base_/nanguard.py' in _base_ or train with "
            "mmnanguard's tools/train.py --guard skip (docs/usage.md)."
        )

    def _warn_about_schedules(self, runner) -> None:
        for name in non_chaining_schedulers(runner):
            runner.logger.warning(
                f'nanguard: {name} recomputes the lr from its stored values: '
                'it discards an lr backoff at its next step'
            )
        for name in lr_setting_hooks(runner):
            runner.logger.warning(
                f'nanguard: {name} sets the lr from its own stored values '
                '(a scheduler hook): an lr backoff is re-applied on top of '
                'what it sets, right before each step'
            )
        spike = self.settings.spike
        if spike is None or not spike.grad_norm:
            return
        amp = [
            type(w).__name__
            for w in optim_wrapper_members(runner.optim_wrapper)
            if isinstance(w, AmpOptimWrapper)
        ]
        if amp:
            runner.logger.warning(
                f'nanguard: grad_norm spikes are not checked for {amp}: '
                'under AMP the GradScaler owns the gradients; loss spikes '
                'are checked'
            )
