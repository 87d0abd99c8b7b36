# Copyright (c) mmnanguard contributors. All rights reserved.
"""``NanGuardRunner``: the runner that ``configs/_base_/nanguard.py`` selects.

Why a Runner subclass selected by ``runner_type``
-------------------------------------------------
The include must turn protection on when added to the ``_base_`` list of an
unmodified mmdet, mmrotate or mmseg config. mmengine refuses two bases that
define the same top-level key (``KeyError: Duplicate key is not allowed
among bases``), so the include cannot define ``custom_hooks`` (rotated
RTMDet has an ``EMAHook``), ``default_hooks`` (every ``default_runtime.py``
defines it), ``optim_wrapper`` (the ``*_amp-*`` configs) or even
``custom_imports`` (mmseg's ConvNeXt/PoolFormer model bases and mmdet's
ConvNeXt configs define it). ``runner_type`` is defined by none of the
upstream configs, and the official ``tools/train.py`` of mmdet, mmrotate
and mmseg all build ``RUNNERS.build(cfg)`` when it is set. The include
names the runner with its scope, ``'mmnanguard.NanGuardRunner'``: mmengine's
``Registry.get`` imports ``mmnanguard.registry`` for a scoped name, which
imports mmnanguard (its stack mends and registrations) before the runner,
the model or any hook is built, so no ``custom_imports`` is needed.

What the runner adds, from the top-level ``nanguard = dict(...)`` key
(:class:`ProtectionSettings`):

* the :class:`NanGuardHook` with the guard settings, registered after the
  config's ``default_hooks`` and ``custom_hooks``, which stay untouched
  (hooks are ordered by priority, so where it is appended does not matter).
  A ``NanGuardHook`` already in ``custom_hooks`` is kept and not doubled;
* every hook of ``nanguard.hooks`` (``when='amp'``: only when an optim
  wrapper is an ``AmpOptimWrapper``). Adding a hook to the default
  protection is one line in ``configs/_base_/nanguard.py``;
* with ``check_labels=True``, every upstream ``CrossEntropyLoss`` module
  of the built model that takes class labels is wrapped by a
  ``CheckedCrossEntropyLoss`` (same module, same loss; out-of-range labels
  such as a Cityscapes 255 raise an error naming the value); mask losses
  (``use_mask=True``) and binary targets are left alone;
* with ``module_swaps=[dict(replace='mmdet.FocalLoss',
  by='StableFocalLoss'), ...]``, the drop-in safe modules for the upstream
  ones (``configs/_base_/safe_modules/``);
* with ``validate_annotations=dict(...)``, a ``ValidateAnnotations``
  transform before the ``Pack*Inputs`` transform of the training pipeline
  and of a ``PipelineSwitchHook``'s ``switch_pipeline``, with
  ``num_classes``/``angle_version``/``ignore_index`` read off the built
  model (the dataloader is built only in ``train()``).

Nothing here refuses a config: a check that cannot be set up (no head
tells ``num_classes``) is turned off with one WARNING naming the config
line that turns it back on. The rewrites are the functions of
:mod:`.rewrite`; :func:`~.rewrite.rewrite_config` applies them to a config
without training.

The optim wrapper is built as the registered guarded counterpart of the
configured type (``OptimWrapper`` -> ``GuardedOptimWrapper``, likewise
``AmpOptimWrapper`` and ``CPUAmpOptimWrapper``, each member of an
``OptimWrapperDict``), with the same arguments; another type is built as
configured and guarded by the hook's class swap. ``clip_grad``'s own norm
read is the guard's one read per step. The train loop is not
touched either, so epoch- and iteration-based loops both work.

The files the run lives on are protected too (:mod:`.crash_safety`):
every local checkpoint and ``last_checkpoint`` is written durably (complete
or absent), old checkpoints are removed only after the new one is durable,
a resume takes the newest checkpoint that loads, and SIGTERM / SIGINT save
a checkpoint at the next iteration boundary and stop with
``TrainingPreempted`` (exit 4 from ``tools/train.py``).
"""

import copy
import logging
from typing import Any, Dict, List, Optional

import torch.nn as nn
from mmengine.dist import master_only
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.optim import AmpOptimWrapper, OptimWrapperDict
from mmengine.runner import Runner

from mmnanguard.optional import require_packages
from mmnanguard.registry import HOOKS, RUNNERS, register_shared

from ..hooks import NanGuardHook
from .crash_safety import (
    check_load_from,
    install_crash_safety,
    resume_target,
)
from .durable_checkpoint import durable_backend_args
from .guarded_optim_config import guarded_optim_wrapper_cfg
from .model_facts import read_model_facts
from .protection import ProtectionSettings
from .rewrite import (
    Note,
    insert_into_dataloader,
    insert_into_switch_pipelines,
    protect_built_model,
    rewrite_model_config,
    validate_transform,
)


def _log(msg: str, level: int = logging.INFO) -> None:
    print_log(f'NanGuardRunner: {msg}', logger='current', level=level)


def _log_notes(notes: List[Note]) -> None:
    for level, note in notes:
        _log(note, level)


@register_shared(RUNNERS)
class NanGuardRunner(Runner):
    """A :class:`~mmengine.runner.Runner` that adds mmnanguard's protection.

    Args:
        *args: Positional arguments of :class:`~mmengine.runner.Runner`.
        nanguard (dict, optional): The protection settings (see
            :class:`ProtectionSettings`). None reads the ``nanguard`` key of
            ``cfg``; a config without it gets the defaults.
        **kwargs: Keyword arguments of :class:`~mmengine.runner.Runner`
            (``Runner.from_cfg`` passes all of them by keyword).

    Example:
        >>> # in a config (what configs/_base_/nanguard.py does)
        >>> runner_type = 'mmnanguard.NanGuardRunner'
        >>> nanguard = dict(policy='skip', escalate_to='rollback')
    """

    def __init__(
        self,
        *args: Any,
        nanguard: Optional[Dict[str, Any]] = None,
        **kwargs: Any,
    ) -> None:
        cfg = kwargs.get('cfg') or {}
        require_packages(cfg, getattr(cfg, 'filename', None))
        if nanguard is None:
            nanguard = cfg.get('nanguard')
        self.protection = ProtectionSettings.from_dict(nanguard)
        #: Every rewrite note (log level, message), in order.
        self.protection_notes: List[Note] = []
        #: The ValidateAnnotations config inserted (None: none).
        self.validate_transform: Optional[Dict[str, Any]] = None
        self._model_protected = False
        model = kwargs.get('model')
        if self.protection.enabled and isinstance(model, dict):
            kwargs['model'] = model = copy.deepcopy(model)
            self.protection_notes += rewrite_model_config(
                model, self.protection, kwargs.get('default_scope')
            )
        super().__init__(*args, **kwargs)

    def _note(self, notes: List[Note]) -> None:
        self.protection_notes += notes
        _log_notes(notes)

    # -- after the model is built, before the dataloader ---------------------
    def build_model(self, model: Any) -> nn.Module:
        """Build the model (as ``Runner``), then, once: check its labels
        and complete ``ValidateAnnotations`` from it in the training
        dataloader config.

        Args:
            model (nn.Module | dict): As in ``Runner.build_model``.

        Returns:
            nn.Module: The built model.
        """
        model = super().build_model(model)
        if not self.protection.enabled or self._model_protected:
            return model
        self._model_protected = True
        _log_notes(self.protection_notes)
        inner = model.module if is_model_wrapper(model) else model
        notes = protect_built_model(inner, self.protection)
        transform, more = validate_transform(
            self.protection, read_model_facts(inner)
        )
        notes += more
        loader = self._train_dataloader
        if isinstance(loader, dict):
            self._train_dataloader = loader = copy.deepcopy(loader)
        notes += insert_into_dataloader(loader, transform)
        self.validate_transform = transform
        self._note(notes)
        return model

    # -- the optim wrapper ----------------------------------------------------
    def build_optim_wrapper(self, optim_wrapper: Any) -> Any:
        """Build the registered guarded counterpart of the configured
        wrapper (:func:`~.guarded_optim_config.guarded_optim_wrapper_cfg`);
        a type without one is built as configured and guarded by the hook.

        Args:
            optim_wrapper: As in ``Runner.build_optim_wrapper``.

        Returns:
            OptimWrapper | OptimWrapperDict: The built wrapper.
        """
        if self.protection.enabled and isinstance(optim_wrapper, dict):
            optim_wrapper, kept = guarded_optim_wrapper_cfg(optim_wrapper)
            if kept:
                _log(
                    f'optim wrapper type(s) {kept} have no registered guarded '
                    'counterpart; NanGuardHook guards them by a class swap'
                )
        return super().build_optim_wrapper(optim_wrapper)

    # -- hooks -------------------------------------------------------------
    def register_hooks(
        self,
        default_hooks: Optional[Dict[str, Any]] = None,
        custom_hooks: Optional[list] = None,
    ) -> None:
        """Register the config's hooks, then the protection hooks.

        Args:
            default_hooks (dict, optional): As in ``Runner``.
            custom_hooks (list, optional): As in ``Runner``; not modified.
        """
        super().register_hooks(default_hooks, custom_hooks)
        if not self.protection.enabled:
            _log("policy='off': no protection added", logging.WARNING)
            return
        if any(isinstance(h, NanGuardHook) for h in self._hooks):
            _log(
                'a NanGuardHook is already in custom_hooks; it is kept and '
                'the nanguard settings are not applied',
                logging.WARNING,
            )
        else:
            self.register_hook(NanGuardHook(**self.protection.guard))
        amp = self._uses_amp()
        for hook_cfg in self.protection.hooks:
            hook_cfg = dict(hook_cfg)
            when = hook_cfg.pop('when')
            if when == 'amp' and not amp:
                continue
            hook = HOOKS.build(hook_cfg)
            if any(type(h) is type(hook) for h in self._hooks):
                _log(
                    f'a {type(hook).__name__} is already configured; the '
                    'one in nanguard.hooks is not added',
                    logging.WARNING,
                )
                continue
            self.register_hook(hook)
        for hook in self._hooks:
            if isinstance(getattr(hook, 'switch_pipeline', None), list):
                hook.switch_pipeline = copy.deepcopy(hook.switch_pipeline)
        self._note(
            insert_into_switch_pipelines(self._hooks, self.validate_transform)
        )
        names = [type(h).__name__ for h in self._hooks]
        _log(f'protection active, hooks in order: {names}')

    def _uses_amp(self) -> bool:
        wrapper = self.optim_wrapper
        if isinstance(wrapper, OptimWrapperDict):
            return any(
                isinstance(w, AmpOptimWrapper) for w in wrapper.values()
            )
        if isinstance(wrapper, AmpOptimWrapper):
            return True
        # not built yet: a config dict
        if isinstance(wrapper, dict):
            return 'Amp' in str(wrapper.get('type', ''))
        return False

    # -- crash safety: durable checkpoints, verified resume, preemption ----
    def register_default_hooks(
        self, hooks: Optional[Dict[str, Any]] = None
    ) -> None:
        """Register the default hooks (as ``Runner``); in a protected run,
        make ``CheckpointHook`` durable and add the ``PreemptionHook``
        (:mod:`.crash_safety`).

        Args:
            hooks (dict, optional): As in ``Runner``.
        """
        super().register_default_hooks(hooks)
        self.preemption_signals = None
        if self.protection.enabled:
            self.preemption_signals = install_crash_safety(self)

    @master_only
    def save_checkpoint(
        self,
        out_dir: str,
        filename: str,
        file_client_args: Optional[dict] = None,
        save_optimizer: bool = True,
        save_param_scheduler: bool = True,
        meta: Optional[dict] = None,
        by_epoch: bool = True,
        backend_args: Optional[dict] = None,
    ) -> None:
        """``Runner.save_checkpoint``; in a protected run a local checkpoint
        is written durably (:mod:`.durable_checkpoint`): complete or
        absent.

        Args: as in ``Runner.save_checkpoint``.
        """
        if self.protection.enabled:
            backend_args = durable_backend_args(
                out_dir, backend_args, file_client_args
            )
        super().save_checkpoint(
            out_dir,
            filename,
            file_client_args,
            save_optimizer=save_optimizer,
            save_param_scheduler=save_param_scheduler,
            meta=meta,
            by_epoch=by_epoch,
            backend_args=backend_args,
        )

    def load_or_resume(self) -> None:
        """``Runner.load_or_resume``; a protected resume takes the newest
        checkpoint that loads and says which and why
        (:mod:`.resume_choice`); a cut-short ``load_from`` is refused.

        Raises:
            UnusableCheckpointError: The checkpoint named for resuming does
                not load and no other one does, or ``load_from`` is cut
                short.
        """
        if self._has_loaded or not self.protection.enabled:
            return super().load_or_resume()
        if not self._resume:
            if self._load_from is not None:
                check_load_from(self._load_from)
            return super().load_or_resume()
        path = resume_target(self.work_dir, self._load_from)
        if path is not None:
            self.resume(path)
            self._has_loaded = True
        return None

    def train(self) -> nn.Module:
        """``Runner.train``; in a protected run SIGTERM and SIGINT save a
        checkpoint at the next iteration boundary and stop training with
        ``TrainingPreempted`` (:mod:`.preemption`). The previous signal
        handlers are restored when training ends.

        Returns:
            nn.Module: The model after training.
        """
        signals = getattr(self, 'preemption_signals', None)
        if signals is None:
            return super().train()
        if not signals.install():
            _log(
                'not in the main thread: SIGTERM and SIGINT stop training '
                'at once, without a checkpoint',
                logging.WARNING,
            )
        try:
            model = super().train()
        finally:
            signals.restore()
        if signals.received is not None:
            _log(
                f'{signals.signal_name} received after the last iteration; '
                'training had finished',
                logging.WARNING,
            )
        return model
