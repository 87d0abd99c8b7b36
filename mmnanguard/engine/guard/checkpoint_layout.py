# Copyright (c) mmnanguard contributors. All rights reserved.
"""Read a model state out of a checkpoint written by any mmengine runner.

``Runner.save_checkpoint`` saves the unwrapped model's state dict, but
``FlexibleRunner`` strategies save their own layout: ``DDPStrategy`` the
wrapper's (every key prefixed ``module.``). mmengine's own loaders strip
that prefix (``revise_keys=[(r'^module\\.', '')]``); a rollback from a
checkpoint must too.

A checkpoint that holds DTensors was written by rank 0 from a sharded
model (mmengine 0.10.7's ``Runner`` with torch's FSDP2): it holds rank 0's
shards only and cannot restore the other ranks' shards. It is refused
(``ValueError``): the rollback takes the in-memory snapshot on every rank.
"""

from typing import Dict

import torch

from .dtensor import is_dtensor

PREFIX = 'module.'


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
        ValueError: ``state`` holds DTensor shards of one rank.
    """
    sharded = [k for k, v in state.items() if is_dtensor(v)]
    if sharded:
        raise ValueError(
            f'the checkpoint holds the DTensor shards of one rank '
            f'({sharded[0]!r} and {len(sharded) - 1} more): it cannot '
            "restore every rank's shards"
        )
    if not state or not all(k.startswith(PREFIX) for k in state):
        return dict(state)
    own = model.state_dict().keys()
    if any(k.startswith(PREFIX) for k in own):
        return dict(state)
    return {k[len(PREFIX) :]: v for k, v in state.items()}
