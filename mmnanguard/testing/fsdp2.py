# Copyright (c) mmnanguard contributors. All rights reserved.
"""Shard an mmengine ``Runner``'s model with torch's FSDP2 (tests only).

mmengine 0.10.7 has no FSDP2 support (its ``FSDPStrategy`` is FSDP1 and
needs an accelerator). Torch's ``fully_shard`` runs on the CPU over gloo,
so the distributed tests shard a real mmdet model with it through the
``Runner``'s ``model_wrapper_cfg``: ``fully_shard`` changes the module in
place (its parameters become DTensors sharded over the ranks) and this
"wrapper" returns the module itself, which keeps its ``train_step``.
"""

from typing import Any

import torch.nn as nn
from mmengine.registry import MODEL_WRAPPERS
from torch.distributed.fsdp import fully_shard

WRAPPER_NAME = 'FullyShardForTests'


class FullyShard:
    """``model_wrapper_cfg=dict(type='FullyShardForTests')``: initialise
    the weights (``init_weights``, the same on every rank with the same
    seed), apply ``fully_shard`` to each direct child module that holds
    parameters (backbone, neck, heads), then to the model; return the model.

    ``Runner.train`` initialises the weights again and broadcasts each
    tensor, which DTensors do not support (``c10d.broadcast_`` has no
    sharding rule): the caller turns that off with :func:`skip_reinit`.

    Args:
        module (nn.Module): The built model.
        **kwargs: Ignored (``Runner.wrap_model`` passes no others).
    """

    def __new__(cls, module: nn.Module, **kwargs: Any) -> nn.Module:
        if hasattr(module, 'init_weights'):
            module.init_weights()
        for child in module.children():
            if any(True for _ in child.parameters()):
                fully_shard(child)
        fully_shard(module)
        return module


def register() -> str:
    """Register :class:`FullyShard` in mmengine's wrapper registry (once).

    Returns:
        str: The type name for ``model_wrapper_cfg``.
    """
    if MODEL_WRAPPERS.get(WRAPPER_NAME) is None:
        MODEL_WRAPPERS.register_module(WRAPPER_NAME, module=FullyShard)
    return WRAPPER_NAME


def skip_reinit(runner: Any) -> None:
    """Keep ``runner.train`` from initialising the (already initialised,
    sharded) weights again (see :class:`FullyShard`)."""
    runner._init_model_weights = lambda: None
