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

from typing import Any, Dict, Optional

import torch.nn as nn
from mmengine.runner import Runner

from mmnanguard.registry import RUNNERS, register_shared

from ..incident.batch_layout import keep_sample_names
from ..incident.sample_origin import keep_sample_origin
from .checkpoint_agreement import agree_before_save
from .durable_checkpoint import durable_backend_args
from .protected_runner import (
    ProtectedRunnerMixin,
    guarded_optim_wrapper,
    init_protection,
    protect_model,
)


@register_shared(RUNNERS)
class NanGuardRunner(ProtectedRunnerMixin, Runner):
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
        init_protection(self, nanguard, kwargs)
        super().__init__(*args, **kwargs)

    @classmethod
    def from_cfg(cls, cfg: Any) -> Runner:
        """Build the runner from a config; a config with a ``strategy``
        (which only ``FlexibleRunner`` reads) builds a
        :class:`~.nanguard_flexible_runner.NanGuardFlexibleRunner`.

        Args:
            cfg (Config | dict): The training config.

        Returns:
            NanGuardRunner | NanGuardFlexibleRunner: The runner.
        """
        if cls is NanGuardRunner and cfg.get('strategy') is not None:
            from .nanguard_flexible_runner import NanGuardFlexibleRunner

            return NanGuardFlexibleRunner.from_cfg(cfg)
        return super().from_cfg(cfg)

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
        return protect_model(self, super().build_model(model))

    @staticmethod
    def build_dataloader(*args: Any, **kwargs: Any) -> Any:
        """``Runner.build_dataloader``, with a collate function that keeps
        the file names of a batch whose ``data_samples`` it packs into a
        dict (mmyolo's ``yolov5_collate``), for the incident reports
        (:class:`~mmnanguard.engine.incident.batch_layout.KeepSampleNames`),
        and dataset pipelines that keep each sample's file and index
        (:class:`~mmnanguard.engine.incident.sample_origin.KeepSampleOrigin`).

        Returns:
            DataLoader: The built dataloader.
        """
        loader = Runner.build_dataloader(*args, **kwargs)
        return keep_sample_origin(keep_sample_names(loader))

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
        return super().build_optim_wrapper(
            guarded_optim_wrapper(self, optim_wrapper)
        )

    # -- crash safety: durable checkpoints ------------------------------------
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
            agree_before_save(self)
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
