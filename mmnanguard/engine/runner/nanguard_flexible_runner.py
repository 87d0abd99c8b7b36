# Copyright (c) mmnanguard contributors. All rights reserved.
"""``NanGuardFlexibleRunner``: the include's protection under mmengine's
``FlexibleRunner`` and its strategies (``DDPStrategy``, ``FSDPStrategy``,
``DeepSpeedStrategy``, ``ColossalAIStrategy``).

It is what :meth:`NanGuardRunner.from_cfg` builds for a config with a
``strategy`` key (``FlexibleRunner`` is the only runner that reads it), and
what ``tools/train.py`` selects for a config whose own file sets
``runner_type='FlexibleRunner'`` (see ``docs/distributed.md``).

It adds what :class:`NanGuardRunner` adds (the same functions of
:mod:`.protected_runner`), where ``FlexibleRunner`` builds things:

* the model: ``FlexibleRunner.train`` hands the model config to
  ``strategy.prepare``, which builds and wraps it in one go. The model is
  built first here with the strategy's own ``build_model`` (so an
  ``FSDPStrategy`` still skips weight init when asked), then protected
  (labels, ``ValidateAnnotations`` completed from it), then handed on;
  ``build_model`` returns a built model as it is;
* the optim wrapper config names the guarded counterpart of each type, as
  in :class:`NanGuardRunner` (``DeepSpeedOptimWrapper``:
  ``GuardedDeepSpeedOptimWrapper``, ZeRO-1/2 in fp32; the DeepSpeed runs
  it does not protect are refused at start, :mod:`.deepspeed_protection`,
  and under DeepSpeed every rank also checks its ZeRO partition state
  before a checkpoint);
* every rank checks the state before a checkpoint is written
  (:mod:`.checkpoint_agreement`): the strategies write on rank 0 only;
* an ``FSDPStrategy`` writing local (sharded) checkpoints is refused at
  start when the run would load one (:mod:`.fsdp1_checks`).

A checkpoint that the strategy writes as one file (``SingleDeviceStrategy``,
``DDPStrategy``) is written durably, as :class:`NanGuardRunner` writes its
own; ``FSDPStrategy`` and ``DeepSpeedStrategy`` write folders of shards
from every rank and are left as they are (:mod:`.durable_checkpoint`).
"""

from typing import Any, Dict, Optional, Union

import torch.nn as nn
from mmengine.runner import FlexibleRunner

from mmnanguard.registry import RUNNERS, register_shared

from .checkpoint_agreement import agree_before_save
from .deepspeed_protection import check_deepspeed_config
from .durable_checkpoint import save_strategy_checkpoint
from .fsdp1_checks import check_fsdp1_checkpoints
from .protected_runner import (
    ProtectedRunnerMixin,
    guarded_optim_wrapper,
    init_protection,
    protect_model,
)


@register_shared(RUNNERS)
class NanGuardFlexibleRunner(ProtectedRunnerMixin, FlexibleRunner):
    """A :class:`~mmengine.runner.FlexibleRunner` that adds mmnanguard's
    protection.

    Args:
        *args: Positional arguments of ``FlexibleRunner``.
        nanguard (dict, optional): The protection settings (see
            :class:`~.protection.ProtectionSettings`). None reads the
            ``nanguard`` key of ``cfg``.
        **kwargs: Keyword arguments of ``FlexibleRunner``.

    Example:
        >>> _base_ = ['./my_detector.py', 'mmnanguard::_base_/nanguard.py']
        >>> strategy = dict(type='DDPStrategy')  # selects this runner
    """

    #: The model config until the model is built, then the model.
    model: Union[nn.Module, Dict[str, Any]]

    def __init__(
        self,
        *args: Any,
        nanguard: Optional[Dict[str, Any]] = None,
        **kwargs: Any,
    ) -> None:
        init_protection(self, nanguard, kwargs)
        check_deepspeed_config(kwargs.get('strategy'), self.protection)
        if 'optim_wrapper' in kwargs:
            kwargs['optim_wrapper'] = guarded_optim_wrapper(
                self, kwargs['optim_wrapper']
            )
        super().__init__(*args, **kwargs)
        # again on the built strategy: a config given as a JSON file
        check_deepspeed_config(self.strategy, self.protection)
        check_fsdp1_checkpoints(self)

    def train(self) -> nn.Module:
        """Build and protect the model, then ``FlexibleRunner.train`` (with
        SIGTERM / SIGINT saving a checkpoint at the next boundary).

        Returns:
            nn.Module: The model after training.
        """
        self.build_protected_model()
        return super().train()

    def build_protected_model(self) -> None:
        """Build the model config with the strategy's own ``build_model``
        and protect it (once; before the training dataloader is built)."""
        if self.protection.enabled and isinstance(self.model, dict):
            self.model = protect_model(
                self, self.strategy.build_model(self.model)
            )

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
        """``FlexibleRunner.save_checkpoint``, after every rank checked the
        state to be written (:func:`~.checkpoint_agreement.agree_before_save`);
        a one-file checkpoint of a local folder is written durably
        (:func:`~.durable_checkpoint.save_strategy_checkpoint`).

        Args: as in ``FlexibleRunner.save_checkpoint``.
        """

        def save(name: str) -> None:
            super(NanGuardFlexibleRunner, self).save_checkpoint(
                out_dir,
                name,
                file_client_args,
                save_optimizer=save_optimizer,
                save_param_scheduler=save_param_scheduler,
                meta=meta,
                by_epoch=by_epoch,
                backend_args=backend_args,
            )

        if not self.protection.enabled:
            return save(filename)
        agree_before_save(self)
        save_strategy_checkpoint(
            save,
            self.strategy,
            out_dir,
            filename,
            backend_args,
            file_client_args,
        )
