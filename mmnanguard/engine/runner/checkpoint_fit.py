# Copyright (c) mmnanguard contributors. All rights reserved.
"""Whether a checkpoint that loads also fits the run that resumes from it.

A checkpoint can pass the secure load and still not be the state of this
model and optimizer (another config wrote it, or a crafted file). mmengine
0.10.7's resume then either crashes half-way (``optimizer.load_state_dict``
raises ``ValueError`` on a different number or size of param groups, a
``KeyError`` on a state without ``param_groups``) after the weights and
the message hub were already taken, or goes on with a warning (a tensor of
another shape is not loaded, ``strict=False``) and trains from the
initial weights of that tensor. :func:`fit_problem` says why a checkpoint
does not fit; the protected resume (:mod:`.resume_choice`) passes over
such a file like a truncated one and takes the next older one that fits.

What is compared, with the built model and optim wrapper:

* every entry of the model's ``state_dict`` is in the checkpoint's
  (after mmengine's ``^module.`` revision), a tensor of the same shape;
* per optimizer, the checkpoint's ``state`` and ``param_groups`` are
  there, the number of groups and of parameters in each group are the
  optimizer's, and the element-wise buffers (``momentum_buffer``,
  ``exp_avg``, ...) have their parameter's shape.

Before any load, the bytes the file declares are held against the model's
(:class:`FitCheck`): a file that would allocate far more than a checkpoint
of this model holds is passed over unread.

Cost: one more secure load of the file (0.3 s for the tiny RetinaNet's
96 MB checkpoint, measured on a loaded 2-core machine) and a walk over the
state dicts (16 ms for it); only the checkpoint a resume picks and the
ones passed over are checked.
"""

import os.path as osp
import re
from typing import Any, Optional

import torch
from mmengine.model import is_model_wrapper
from mmengine.optim import OptimWrapperDict

from mmnanguard.compat.checkpoint_allowlist import load_from_local
from mmnanguard.compat.declared_sizes import (
    declared_bytes,
    human,
    size_problem,
)
from mmnanguard.engine.guard.checkpoint_layout import one_rank_shards
from mmnanguard.engine.guard.dtensor import is_dtensor
from mmnanguard.engine.guard.fsdp1_state import loads_through_strategy
from mmnanguard.engine.guard.snapshot import unwrap_model
from mmnanguard.fileio.checkpoint_verify import LOAD_ERRORS

#: Optimizer state entries that have their parameter's shape.
ELEMENTWISE_STATE = (
    'momentum_buffer',
    'exp_avg',
    'exp_avg_sq',
    'max_exp_avg_sq',
    'square_avg',
    'acc_delta',
    'sum',
)
#: How a problem found by :func:`fit_check` starts.
NOT_FITTING = 'it does not fit the model or optimizer'
#: How many times the bytes of the model's parameters and buffers a
#: checkpoint's records may declare (:class:`FitCheck`), plus
#: :data:`SLACK_BYTES` (the message hub, the scheduler, small models).
MODEL_BYTES_FACTOR = 8
SLACK_BYTES = 64 << 20
#: mmengine's default ``revise_keys`` of ``Runner.load_checkpoint``.
MODULE_PREFIX = re.compile(r'^module\.')


def _shape(value: Any) -> str:
    return str(tuple(value.shape)) if hasattr(value, 'shape') else '-'


def model_problem(saved: Any, model: torch.nn.Module) -> Optional[str]:
    """Why ``saved`` (a checkpoint's ``state_dict``) does not fit
    ``model``; None when it does."""
    if not isinstance(saved, dict):
        return f"its 'state_dict' is a {type(saved).__name__}, not a dict"
    sharded = one_rank_shards(saved)
    if sharded is not None:
        return sharded
    own = unwrap_model(model).state_dict()
    revised = {MODULE_PREFIX.sub('', str(k)): v for k, v in saved.items()}
    missing = [key for key in own if key not in revised]
    if missing:
        return (
            f"its 'state_dict' lacks {len(missing)} of the model's "
            f'{len(own)} entries (first: {missing[:3]})'
        )
    for key, tensor in own.items():
        value = revised[key]
        if not isinstance(value, torch.Tensor):
            return (
                f'its state_dict[{key!r}] is a {type(value).__name__}, '
                'not a tensor'
            )
        if value.shape != tensor.shape:
            return (
                f'its state_dict[{key!r}] has shape {_shape(value)}, the '
                f"model's {_shape(tensor)}"
            )
    return None


def optimizer_problem(
    saved: Any, optimizer: torch.optim.Optimizer, where: str
) -> Optional[str]:
    """Why ``saved`` (an optimizer state dict) does not fit ``optimizer``;
    None when it does.

    Args:
        saved: The checkpoint's state of this optimizer.
        optimizer (Optimizer): The built optimizer.
        where (str): The state's key in the checkpoint, for the message.
    """
    if not isinstance(saved, dict):
        return f'its {where} is a {type(saved).__name__}, not a dict'
    groups, state = saved.get('param_groups'), saved.get('state')
    if not isinstance(groups, list) or not isinstance(state, dict):
        return f"its {where} has no 'param_groups' list and 'state' dict"
    own = optimizer.param_groups
    if len(groups) != len(own):
        return (
            f'its {where} has {len(groups)} param groups, the optimizer '
            f'{len(own)}'
        )
    for i, (group, own_group) in enumerate(zip(groups, own)):
        ids = group.get('params') if isinstance(group, dict) else None
        if not isinstance(ids, list) or len(ids) != len(own_group['params']):
            count = len(ids) if isinstance(ids, list) else ids
            return (
                f'its {where} param group {i} holds {count} parameters, '
                f"the optimizer's {len(own_group['params'])}"
            )
        for param_id, param in zip(ids, own_group['params']):
            entry = state.get(param_id)
            if not isinstance(entry, dict):
                continue
            for name in ELEMENTWISE_STATE:
                value = entry.get(name)
                if (
                    isinstance(value, torch.Tensor)
                    and value.shape != param.shape
                ):
                    return (
                        f'its {where} {name} of parameter {param_id} has '
                        f'shape {_shape(value)}, the parameter '
                        f'{_shape(param)}'
                    )
    return None


def fit_problem(
    checkpoint: Any, model: torch.nn.Module, optim_wrapper: Any
) -> Optional[str]:
    """Why ``checkpoint`` does not fit the built ``model`` and
    ``optim_wrapper``; None when it does (see the module docstring).

    Args:
        checkpoint (dict): A loaded mmengine checkpoint (anything else
            does not fit).
        model (nn.Module): The runner's model (wrapped or not).
        optim_wrapper: The runner's built ``OptimWrapper`` or
            ``OptimWrapperDict``; anything else (not built) is not
            compared.

    Returns:
        str | None: A phrase to follow the file name, or None.
    """
    if not isinstance(checkpoint, dict):
        return f'it holds a {type(checkpoint).__name__}, not a dict'
    problem = model_problem(checkpoint.get('state_dict'), model)
    if problem is not None or 'optimizer' not in checkpoint:
        return problem
    saved = checkpoint['optimizer']
    if isinstance(optim_wrapper, OptimWrapperDict):
        if not isinstance(saved, dict):
            return f"its 'optimizer' is a {type(saved).__name__}, not a dict"
        for name, wrapper in optim_wrapper.items():
            problem = optimizer_problem(
                saved.get(name), wrapper.optimizer, f'optimizer[{name!r}]'
            )
            if problem is not None:
                return problem
        return None
    optimizer = getattr(optim_wrapper, 'optimizer', None)
    if not isinstance(optimizer, torch.optim.Optimizer):
        return None
    return optimizer_problem(saved, optimizer, "'optimizer'")


class FitCheck:
    """Whether a checkpoint fits the runner about to resume from it.

    :meth:`size_problem` is asked before the file is loaded at all: the
    bytes its records declare (:func:`~mmnanguard.compat.declared_sizes.
    declared_bytes`, read off the file without loading it) may be at most
    :data:`MODEL_BYTES_FACTOR` times the bytes of the model's parameters
    and buffers, plus :data:`SLACK_BYTES`. A checkpoint holds the weights,
    the optimizer's moments (two for Adam) and maybe an EMA copy: about 4
    times. A file that declares more is another model's, or a crafted one
    that would make the load allocate it. Calling the check (after the
    secure load) compares the loaded state with the model and optimizer
    (:func:`fit_problem`).

    Args:
        runner: The runner about to resume (model and optim wrapper
            built).
    """

    def __init__(self, runner: Any) -> None:
        self.runner = runner

    def size_problem(self, path: str) -> Optional[str]:
        """Why ``path`` declares more bytes than a checkpoint of this
        model holds; None when it does not (or cannot be told)."""
        if loads_through_strategy(self.runner):
            return None  # FSDP1: the modules hold this rank's shards
        try:
            if size_problem(path) is not None:
                return None  # a bomb by its own size: the verifier names it
            declared = declared_bytes(path)
        except OSError:
            return None  # the load names the file
        model = self.runner.model
        own = state_bytes(model.module if is_model_wrapper(model) else model)
        bound = MODEL_BYTES_FACTOR * own + SLACK_BYTES
        if declared is None or declared <= bound:
            return None
        return (
            f'{NOT_FITTING}: it declares {human(declared)} of records, more '
            f"than {MODEL_BYTES_FACTOR} times the {human(own)} of the model's "
            f'parameters and buffers plus {human(SLACK_BYTES)} (another '
            "model's checkpoint, or a crafted file); nothing was loaded"
        )

    def __call__(self, path: str) -> Optional[str]:
        """Why the loaded ``path`` does not fit, as ``"it does not fit the
        model or optimizer: ..."``; None when it fits."""
        if osp.isdir(path):
            # a folder of every rank's part (DeepSpeed): the strategy
            # loads each rank's partition and checks it against its own
            return None
        try:
            checkpoint = load_from_local(path, map_location='cpu')
        except LOAD_ERRORS as err:  # it loaded a moment ago
            return f'it does not load: {type(err).__name__}: {err}'
        if loads_through_strategy(self.runner):
            # FSDP1: this rank's modules hold flat shards, not the full
            # shapes of the file; FSDP's state-dict API checks them on load
            return None
        problem = fit_problem(
            checkpoint, self.runner.model, self.runner.optim_wrapper
        )
        if problem is None:
            return None
        return f'{NOT_FITTING}: {problem}'


def state_bytes(module: torch.nn.Module) -> int:
    """The bytes of ``module``'s parameters and buffers (its
    ``state_dict``'s tensors, each storage once; a DTensor by its global
    size, which has no storage of its own)."""
    seen, total = set(), 0
    for tensor in module.state_dict().values():
        if is_dtensor(tensor):
            total += tensor.numel() * tensor.element_size()
            continue
        storage = tensor.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if key not in seen:
            seen.add(key)
            total += storage.nbytes()
    return total


def fit_check(runner: Any) -> FitCheck:
    """The :class:`FitCheck` of ``runner``.

    Args:
        runner: The runner about to resume (model and optim wrapper
            built).

    Returns:
        FitCheck: ``size_problem(path)`` before the load, and called,
        ``"it does not fit the model or optimizer: ..."`` or None after.
    """
    return FitCheck(runner)


__all__ = [
    'FitCheck',
    'MODEL_BYTES_FACTOR',
    'NOT_FITTING',
    'SLACK_BYTES',
    'fit_check',
    'fit_problem',
    'model_problem',
    'optimizer_problem',
    'state_bytes',
]
