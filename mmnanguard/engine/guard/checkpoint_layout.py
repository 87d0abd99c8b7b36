# Copyright (c) mmnanguard contributors. All rights reserved.
"""Read a model state out of a checkpoint written by any mmengine runner.

``Runner.save_checkpoint`` saves the unwrapped model's state dict, but
``FlexibleRunner`` strategies save their own layout: ``DDPStrategy`` the
wrapper's (every key prefixed ``module.``). mmengine's own loaders strip
that prefix (``revise_keys=[(r'^module\\.', '')]``); a rollback from a
checkpoint must too.

A checkpoint that holds DTensors was written by rank 0 from a sharded
model (mmengine 0.10.7's ``Runner`` with torch's FSDP2): it holds rank 0's
shards only and cannot restore the other ranks' shards
(:func:`one_rank_shards`). The rollback refuses it
(:class:`ShardedCheckpointError`) and takes the in-memory snapshot on every
rank; the protected resume passes over it; ``NanGuardHook`` refuses to
load it (``after_load_checkpoint``: a plain runner would otherwise resume
rank 0's shards and momentum on every rank, and the next step fail with a
shape mismatch).
"""

from typing import Any, Dict, Optional

import torch

from .dtensor import is_dtensor

PREFIX = 'module.'


class ShardedCheckpointError(ValueError):
    """A checkpoint holds the DTensor shards of one rank: it cannot
    restore a sharded model."""


def one_rank_shards(state: Any) -> Optional[str]:
    """Why ``state`` (a checkpoint's ``state_dict``) cannot restore a
    sharded model, with the fix; None when it holds no DTensor.

    Args:
        state: A checkpoint's ``state_dict`` (anything else: None).

    Returns:
        str | None: The reason.
    """
    if not isinstance(state, dict):
        return None
    sharded = [key for key, value in state.items() if is_dtensor(value)]
    if not sharded:
        return None
    return (
        f'its state_dict holds the DTensor shards of one rank '
        f'({sharded[0]!r} and {len(sharded) - 1} more: rank 0 saved its '
        "own shards of a sharded model, as mmengine's Runner does under "
        "torch's FSDP2), so every rank would load rank 0's shards. "
        "FlexibleRunner with FSDPStrategy(state_dict_cfg='full') writes "
        'checkpoints that restore every rank'
    )


def model_state_for(
    state: Dict[str, torch.Tensor], model: torch.nn.Module
) -> Dict[str, torch.Tensor]:
    """``state`` with the wrapper prefix removed when ``model`` (the
    unwrapped model it is loaded into) has no key with that prefix.

    Args:
        state (dict): A checkpoint's ``state_dict``.
        model (nn.Module): The unwrapped model.

    Returns:
        dict: A new state dict whose keys are ``model``'s.

    Raises:
        ShardedCheckpointError: ``state`` holds DTensor shards of one rank.
    """
    problem = one_rank_shards(state)
    if problem is not None:
        raise ShardedCheckpointError(f'the checkpoint: {problem}')
    if not state or not all(k.startswith(PREFIX) for k in state):
        return dict(state)
    own = model.state_dict().keys()
    if any(k.startswith(PREFIX) for k in own):
        return dict(state)
    return {k[len(PREFIX) :]: v for k, v in state.items()}
