# Copyright (c) mmnanguard contributors. All rights reserved.
"""A checkpoint of mmengine's ``FSDPStrategy`` (torch FSDP1), restored
through the strategy.

Under FSDP1 the model inside the wrapper holds this rank's shards (flat
views, ``use_orig_params=True``): an in-memory snapshot of its
``state_dict()`` restores them rank by rank. A checkpoint written by the
strategy holds the layout of its ``state_dict_cfg``: with ``'full'``, the
full tensors (rank 0 writes, every rank reads the same file). Loaded into
the inner module, those fail (``size mismatch``) and leave the failing
state in memory, so they are loaded through the strategy's own
``load_model_state_dict`` and ``load_optim_state_dict`` (FSDP's
``state_dict_type`` API; both collective: a rollback runs on every rank).

The ``'local'`` layout (each rank's ``ShardedTensor`` shards in
``iter_N.pth/rank{R}.pth``) is not loaded: mmengine's checkpoint loader,
allowlisted (:mod:`mmnanguard.compat.checkpoint_allowlist`), refuses its
pickled ``ShardedTensor``; the protected runner refuses such a rollback
or resume at start (:mod:`mmnanguard.engine.runner.fsdp1_checks`).
"""

from typing import Any

from torch.distributed.fsdp import FullyShardedDataParallel, StateDictType


def loads_through_strategy(runner: Any) -> bool:
    """Whether ``runner``'s checkpoints are restored through its strategy:
    a ``FlexibleRunner`` whose model is an FSDP1 wrapper.

    Args:
        runner: The runner.
    """
    return isinstance(runner.model, FullyShardedDataParallel) and hasattr(
        runner, 'strategy'
    )


def writes_full_state(strategy: Any) -> bool:
    """Whether ``strategy`` (an ``FSDPStrategy``) writes full state dicts
    (``state_dict_cfg='full'``), which a rollback and a resume can load.

    Args:
        strategy: The ``FlexibleRunner``'s strategy.
    """
    return strategy.state_dict_type == StateDictType.FULL_STATE_DICT


def load_strategy_state(runner: Any, model: dict, optimizer: dict) -> None:
    """Load a checkpoint's model and optimizer states through the strategy
    (on every rank: FSDP gathers and scatters the shards).

    Args:
        runner: The ``FlexibleRunner``.
        model (dict): The checkpoint's ``state_dict``.
        optimizer (dict): The checkpoint's ``optimizer``.
    """
    runner.strategy.load_model_state_dict(model, strict=True)
    runner.strategy.load_optim_state_dict(optimizer)
