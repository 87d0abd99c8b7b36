# Copyright (c) mmnanguard contributors. All rights reserved.
"""The known-good training state that a rollback restores."""

from typing import Any, Dict, List, Optional, cast

import torch
from mmengine.hooks import EMAHook
from mmengine.model import is_model_wrapper
from mmengine.runner.checkpoint import CheckpointLoader, weights_to_cpu
from mmengine.utils import apply_to

from .checkpoint_layout import model_state_for
from .fsdp1_state import load_strategy_state, loads_through_strategy


def _copy(x: torch.Tensor, device: Optional[str]) -> torch.Tensor:
    if not device:
        return x.detach().clone()
    # a CUDA -> CPU copy is queued without a host sync (into pinned
    # memory); the guard's next read, queued after it, completes it before
    # the snapshot is confirmed and can be restored
    return x.detach().to(device, copy=True, non_blocking=x.is_cuda)


def _clone_tree(tree: Any, device: Optional[str] = 'cpu') -> Any:
    """Copy every tensor in ``tree`` (to ``device``); rebuild containers."""
    return apply_to(
        tree,
        lambda x: isinstance(x, torch.Tensor),
        lambda x: _copy(x, device),
    )


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside a DDP / FSDP wrapper, or the model itself."""
    if is_model_wrapper(model):
        # a wrapper's ``module`` (torch types a submodule Tensor | Module)
        return cast(torch.nn.Module, model.module)
    return model


def scheduler_states(runner) -> Any:
    """``state_dict()`` of every param scheduler, shaped as the runner's."""
    schedulers = runner.param_schedulers
    if schedulers is None:
        return None
    if isinstance(schedulers, dict):
        return {k: [s.state_dict() for s in v] for k, v in schedulers.items()}
    return [s.state_dict() for s in schedulers]


def _load_scheduler_states(runner, states: Any) -> None:
    schedulers = runner.param_schedulers
    if schedulers is None or states is None:
        return
    if isinstance(schedulers, dict):
        for name, group in schedulers.items():
            for scheduler, state in zip(group, states[name]):
                scheduler.load_state_dict(state)
    else:
        for scheduler, state in zip(schedulers, states):
            scheduler.load_state_dict(state)


def optimizer_state(optim_wrapper) -> Dict[str, Any]:
    """What a snapshot keeps of ``optim_wrapper``: its
    ``snapshot_state_dict()`` where it has one (a wrapper whose
    ``state_dict`` leaves out this rank's partitioned state, as DeepSpeed's
    does), else its ``state_dict()``."""
    state_dict = getattr(optim_wrapper, 'snapshot_state_dict', None)
    return (state_dict or optim_wrapper.state_dict)()


def load_optimizer_state(optim_wrapper, state: Dict[str, Any]) -> None:
    """Restore what :func:`optimizer_state` returned."""
    load = getattr(optim_wrapper, 'load_snapshot_state_dict', None)
    (load or optim_wrapper.load_state_dict)(state)


def ema_hooks(runner) -> List[EMAHook]:
    """The runner's EMA hooks."""
    return [h for h in runner.hooks if isinstance(h, EMAHook)]


class TrainingSnapshot:
    """Model, optimizer (with GradScaler), param-scheduler position and EMA
    weights at one iteration.

    Args:
        iteration (int): The iteration the state belongs to.
        model (dict): Model state dict.
        optimizer (dict): ``optim_wrapper.state_dict()`` (it holds the
            ``loss_scaler`` state of an ``AmpOptimWrapper``).
        schedulers: Param scheduler states.
        ema (list[dict]): State of each ``EMAHook.ema_model``.
        source (str): ``'memory'`` or the checkpoint's path.
        through_strategy (bool): Whether model and optimizer states are in
            the layout of an FSDP1 strategy's checkpoint and are restored
            through it (:mod:`.fsdp1_state`).
    """

    def __init__(
        self,
        iteration: int,
        model: Dict[str, torch.Tensor],
        optimizer: Dict[str, Any],
        schedulers: Any = None,
        ema: Optional[List[Dict[str, torch.Tensor]]] = None,
        source: str = 'memory',
        through_strategy: bool = False,
    ) -> None:
        self.iteration = iteration
        self.model = model
        self.optimizer = optimizer
        self.schedulers = schedulers
        self.ema = ema or []
        self.source = source
        self.through_strategy = through_strategy

    @classmethod
    def capture(cls, runner, device: Optional[str] = 'cpu'):
        """Copy the runner's current state (to ``device``, default CPU)."""
        return cls(
            iteration=runner.iter,
            model=_clone_tree(unwrap_model(runner.model).state_dict(), device),
            optimizer=_clone_tree(
                optimizer_state(runner.optim_wrapper), device
            ),
            schedulers=_clone_tree(scheduler_states(runner), device),
            ema=[
                _clone_tree(h.ema_model.state_dict(), device)
                for h in ema_hooks(runner)
            ],
        )

    @classmethod
    def from_checkpoint(cls, runner, path: str):
        """Read the state that ``path`` (an mmengine checkpoint) holds.

        ``EMAHook`` swaps the EMA weights into ``state_dict`` when it saves;
        this swaps them back, as ``EMAHook.after_load_checkpoint`` does.
        An FSDP1 strategy's checkpoint keeps its layout and is restored
        through the strategy.
        """
        ckpt = CheckpointLoader.load_checkpoint(path, map_location='cpu')
        through_strategy = loads_through_strategy(runner)
        if through_strategy:
            model_state = dict(ckpt['state_dict'])
        else:
            model_state = model_state_for(
                ckpt['state_dict'], unwrap_model(runner.model)
            )
        ema_state = ckpt.get('ema_state_dict')
        ema = []
        if ema_state is not None and ema_hooks(runner):
            ema_state = dict(ema_state)
            for key in list(model_state):
                ema_key = f'module.{key}'
                if ema_key in ema_state:
                    model_state[key], ema_state[ema_key] = (
                        ema_state[ema_key],
                        model_state[key],
                    )
            ema = [ema_state]
        meta = ckpt.get('meta', {})
        return cls(
            iteration=meta.get('iter', -1),
            model=model_state,
            optimizer=ckpt['optimizer'],
            schedulers=ckpt.get('param_schedulers'),
            ema=ema,
            source=path,
            through_strategy=through_strategy,
        )

    def restore(self, runner) -> None:
        """Load the state into the runner's model, optimizer, schedulers and
        EMA hooks. The snapshot itself stays untouched (fresh copies are
        loaded, since optimizers alias the tensors they are given)."""
        optimizer = _clone_tree(self.optimizer, None)
        if self.through_strategy:
            load_strategy_state(runner, self.model, optimizer)
        else:
            unwrap_model(runner.model).load_state_dict(self.model)
            load_optimizer_state(runner.optim_wrapper, optimizer)
        _load_scheduler_states(runner, _clone_tree(self.schedulers, None))
        for hook, state in zip(ema_hooks(runner), self.ema):
            hook.ema_model.load_state_dict(state)


def write_runner_state(runner, checkpoint: dict) -> None:
    """Put the runner's current model, optimizer and scheduler states into
    a checkpoint dict that ``Runner.save_checkpoint`` is about to write (as
    it builds them: tensors on the CPU). Only the keys already present are
    replaced, besides ``state_dict``.
    """
    checkpoint['state_dict'] = weights_to_cpu(
        unwrap_model(runner.model).state_dict()
    )
    if 'optimizer' in checkpoint:
        checkpoint['optimizer'] = apply_to(
            runner.optim_wrapper.state_dict(),
            lambda x: hasattr(x, 'cpu'),
            lambda x: x.cpu(),
        )
    if 'param_schedulers' in checkpoint:
        checkpoint['param_schedulers'] = scheduler_states(runner)
