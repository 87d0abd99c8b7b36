# Copyright (c) mmnanguard contributors. All rights reserved.
"""Plain tensors out of DTensors (sharded training: FSDP2, tensor
parallel) for the guard's single read, with no collective of its own.

Under FSDP2 (``torch.distributed.fsdp.fully_shard``) gradients and
parameters are DTensors sharded over the ranks. A parameter's or a
gradient's local shard is what this rank checks; the ranks' findings are
then summed by the read's one ``all_reduce``, and so are their shares of
the gradient norm (:mod:`.grad_norm`). A norm that is not folded there is
a replicated DTensor (its reduction happens inside the norm, as in
``clip_grad_norm_``); its local value is the global one.

FSDP1's local state dict (mmengine's ``FSDPStrategy`` with
``state_dict_cfg='local'``) holds ``ShardedTensor`` values instead; their
local part is this rank's shards, flattened.
"""

from typing import Any

import torch
from torch import Tensor
from typing_extensions import TypeGuard

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover (torch < 2.4)
    DTensor = None  # type: ignore[assignment,misc]  # the class or None

try:
    from torch.distributed._shard.sharded_tensor import ShardedTensor
except ImportError:  # pragma: no cover (torch without distributed)
    ShardedTensor = None  # type: ignore[assignment,misc]  # class or None


def is_dtensor(value: Any) -> TypeGuard[DTensor]:
    """Whether ``value`` is a DTensor."""
    return DTensor is not None and isinstance(value, DTensor)


def local(value: Tensor) -> Tensor:
    """This rank's part of ``value`` (``value`` itself if it is neither a
    DTensor nor a ``ShardedTensor``); no communication.

    A ``ShardedTensor``'s part is its local shards, flattened and joined
    (an empty tensor of its dtype when this rank holds none).
    """
    if is_dtensor(value):
        return value.to_local()
    if ShardedTensor is not None and isinstance(value, ShardedTensor):
        shards = [shard.tensor.reshape(-1) for shard in value.local_shards()]
        if not shards:
            return torch.empty(0, dtype=value.dtype)
        return shards[0] if len(shards) == 1 else torch.cat(shards)
    return value


def global_value(value: Tensor) -> Tensor:
    """The value every rank sees: a replicated DTensor's local copy (no
    communication); a sharded or partial one is gathered (one collective;
    only a tensor-parallel loss is such a value, never under FSDP2)."""
    if not is_dtensor(value):
        return value
    if all(p.is_replicate() for p in value.placements):
        return value.to_local()
    return value.full_tensor()
