# Copyright (c) mmnanguard contributors. All rights reserved.
"""Inject a known numerical fault at one iteration (chaos testing).

:class:`FaultInjectionHook` is a test and drill helper, not part of the
product: ``import mmnanguard`` does not register it. It is registered (in
mmnanguard's ``HOOKS`` and in MMEngine's root ``HOOKS``, so that
``type='FaultInjectionHook'`` builds in every scope) only on
``import mmnanguard.testing``. A config that plants a fault imports it
itself:

Example:
    >>> custom_imports = dict(
    ...     imports=['mmnanguard.testing'], allow_failed_imports=False)
    >>> custom_hooks = [
    ...     dict(type='FaultInjectionHook', fault='nan_grad', iteration=6)]
"""

from typing import Any, List, Optional, Set

import torch
import torch.nn as nn
from mmengine.dist import get_rank
from mmengine.hooks import Hook

from mmnanguard.engine.guard.dtensor import local
from mmnanguard.engine.guard.snapshot import unwrap_model
from mmnanguard.engine.optimizers import optim_wrapper_members
from mmnanguard.registry import HOOKS, register_shared

FAULTS = (
    'nan_pixel',
    'inf_loss',
    'nan_grad',
    'lr_spike',
    'nan_optimizer_state',
    'scale_module',
)


@register_shared(HOOKS)
class FaultInjectionHook(Hook):
    """Plant one numerical fault at ``iteration`` to show what a guard does.

    A test and drill helper: registered only on ``import mmnanguard.testing``
    (in a config: ``custom_imports=dict(imports=['mmnanguard.testing'],
    allow_failed_imports=False)``).

    Faults:

    * ``nan_pixel``: a NaN in the first image the model receives (after
      the data preprocessor).
    * ``inf_loss``: ``+inf`` added to the loss term ``loss_key`` (default:
      the first term whose name starts with ``loss``).
    * ``nan_grad``: a term ``sqrt(sum((w - w.detach())**2))`` on the first
      parameter that requires a gradient and that an optimizer holds (under
      DeepSpeed ZeRO, whose optimizer holds flat partitions only: the first
      that requires a gradient) whose shard on this rank is not empty: its
      value is 0, its gradient is NaN.
    * ``lr_spike``: every learning rate set to ``value`` (default 1e12).
    * ``nan_optimizer_state``: a NaN written into the first optimizer state
      tensor (e.g. SGD's momentum buffer) before the step.
    * ``scale_module``: the weights of module ``module_name`` multiplied by
      ``value`` (default 1e38) so that its output overflows.

    Args:
        fault (str): One of :data:`FAULTS`.
        iteration (int): The 0-based iteration to plant it in.
        rank (int, optional): Only this rank plants it (DDP tests).
        loss_key (str, optional): Loss term for ``inf_loss``.
        value (float, optional): lr for ``lr_spike``, factor for
            ``scale_module``.
        module_name (str, optional): Module for ``scale_module``.
    """

    priority = 'HIGHEST'

    def __init__(
        self,
        fault: str,
        iteration: int,
        rank: Optional[int] = None,
        loss_key: Optional[str] = None,
        value: Optional[float] = None,
        module_name: Optional[str] = None,
    ) -> None:
        if fault not in FAULTS:
            raise ValueError(
                f'FaultInjectionHook: fault={fault!r} is '
                f'invalid; allowed values are {FAULTS}'
            )
        if not isinstance(iteration, int) or iteration < 0:
            raise ValueError(
                f'FaultInjectionHook: iteration={iteration!r} '
                'is invalid; expected an integer >= 0'
            )
        if fault == 'scale_module' and not module_name:
            raise ValueError(
                'FaultInjectionHook: fault=scale_module needs '
                "module_name, e.g. 'neck.fpn_convs.0.conv'"
            )
        self.fault = fault
        self.iteration = iteration
        self.rank = rank
        self.loss_key = loss_key
        self.value = value
        self.module_name = module_name
        self.injected_at: List[int] = []
        self._handles: List[Any] = []
        self._held: Set[int] = set()

    def _due(self, runner) -> bool:
        return runner.iter == self.iteration and (
            self.rank is None or self.rank == get_rank()
        )

    def before_train_iter(
        self, runner, batch_idx: int, data_batch=None
    ) -> None:
        """Plant the fault for this iteration."""
        if not self._due(runner):
            return
        self.injected_at.append(runner.iter)
        model = unwrap_model(runner.model)
        if self.fault == 'nan_pixel':
            self._handles.append(
                model.data_preprocessor.register_forward_hook(_nan_pixel)
            )
        elif self.fault in ('inf_loss', 'nan_grad'):
            self._held = _held_by_optimizers(runner.optim_wrapper)
            self._handles.append(
                model.register_forward_hook(self._poison_losses)
            )
        elif self.fault == 'lr_spike':
            lr = 1e12 if self.value is None else self.value
            for wrapper in optim_wrapper_members(runner.optim_wrapper):
                for group in wrapper.optimizer.param_groups:
                    group['lr'] = lr
        elif self.fault == 'nan_optimizer_state':
            _poison_optimizer_state(runner.optim_wrapper)
        else:
            module = model.get_submodule(self.module_name)
            with torch.no_grad():
                for param in module.parameters():
                    param.mul_(1e38 if self.value is None else self.value)

    def after_train_iter(
        self, runner, batch_idx: int, data_batch=None, outputs=None
    ) -> None:
        """Remove the forward hooks planted for this iteration."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _poison_losses(self, module, args, losses):
        if self.fault == 'inf_loss':
            key = self.loss_key or next(k for k in losses if 'loss' in k)
            value = losses[key]
            if isinstance(value, (list, tuple)):
                losses[key] = [value[0] + float('inf')] + list(value[1:])
            else:
                losses[key] = value + float('inf')
        else:
            weight = local(_gradient_target(module, self._held))
            losses['loss_fault_sqrt'] = torch.sqrt(
                ((weight - weight.detach()) ** 2).sum()
            )
        return losses


def _gradient_target(module: nn.Module, held: Set[int]) -> torch.Tensor:
    """The parameter ``nan_grad`` poisons: the first one that requires a
    gradient, holds elements on this rank (under FSDP2 a small parameter's
    shard may be empty) and that an optimizer holds; where the optimizer
    holds none of the module's parameters (DeepSpeed ZeRO steps flat fp32
    partitions that its gradient hooks fill from the module's gradients),
    the first one that requires a gradient.

    Raises:
        RuntimeError: No parameter of ``module`` qualifies on this rank.
    """
    trainable = [
        p for p in module.parameters() if p.requires_grad and local(p).numel()
    ]
    for param in trainable:
        if id(param) in held:
            return param
    if trainable and not any(id(p) in held for p in module.parameters()):
        return trainable[0]
    raise RuntimeError(
        f'FaultInjectionHook: fault=nan_grad on rank {get_rank()} needs a '
        'parameter that requires a gradient, holds elements on this rank '
        f'and that an optimizer steps; {type(module).__name__} has '
        f'{len(trainable)} such parameter(s) with elements here, none in '
        "an optimizer's param groups. Plant it on another rank (rank=...) "
        'or use fault=inf_loss'
    )


def _held_by_optimizers(optim_wrapper) -> Set[int]:
    """The ids of the parameters the optimizers step (a parameter outside
    every param group, e.g. one frozen by leaving it out, gets no update
    and is never a fault's target)."""
    return {
        id(param)
        for wrapper in optim_wrapper_members(optim_wrapper)
        for group in wrapper.optimizer.param_groups
        for param in group['params']
    }


def _nan_pixel(module, args, output):
    output['inputs'][0].view(-1)[0] = float('nan')
    return output


def _poison_optimizer_state(optim_wrapper) -> None:
    for wrapper in optim_wrapper_members(optim_wrapper):
        for state in wrapper.optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor) and value.numel() > 1:
                    local(value).view(-1)[0] = float('nan')  # this rank's
                    return
    raise RuntimeError(
        'FaultInjectionHook: the optimizer has no state yet; '
        'plant nan_optimizer_state after the first step'
    )
