# Copyright (c) mmnanguard contributors. All rights reserved.
"""Decisions every rank takes together, outside the per-iteration path.

The per-iteration verdict is agreed inside StepGuard's single read. What is
decided at a checkpoint or a rollback (rare events, where one more
collective and one host read cost nothing measurable) is agreed here, so
that no rank writes, restores or skips alone.
"""

from typing import Any, List, Optional

import torch
from mmengine import dist

from .dtensor import local


def is_distributed() -> bool:
    """Whether more than one rank takes part."""
    return dist.get_world_size() > 1


def any_rank(flag: bool) -> bool:
    """Whether ``flag`` is True on at least one rank (one ``all_reduce``;
    call it on every rank). Without a process group: ``flag``.

    Args:
        flag (bool): This rank's finding.

    Returns:
        bool: The finding agreed by all ranks.
    """
    if not is_distributed():
        return bool(flag)
    # mmengine's all_reduce moves it to the backend's device and back
    vote = torch.tensor([1.0 if flag else 0.0])
    dist.all_reduce(vote, op='sum')
    return vote.item() > 0


def same_on_every_rank(value: Optional[str]) -> bool:
    """Whether every rank holds the same ``value`` (one ``all_gather`` of
    the objects; call it on every rank).

    Args:
        value (str, optional): This rank's value (e.g. the checkpoint a
            rollback would load; None: none).

    Returns:
        bool: True when all ranks hold an equal value.
    """
    if not is_distributed():
        return True
    values: List[Any] = dist.all_gather_object(value)
    return all(v == values[0] for v in values)


def local_tensors(tree: Any) -> Any:
    """``tree`` with each DTensor or ``ShardedTensor`` replaced by this
    rank's shard (:func:`~.dtensor.local`; no communication: a sharded
    state is checked rank by rank and the findings are then agreed with
    :func:`any_rank`).

    Args:
        tree: Tensors in dicts / lists / tuples.

    Returns:
        The same structure with plain tensors.
    """
    if isinstance(tree, torch.Tensor):
        return local(tree)
    if isinstance(tree, dict):
        return {k: local_tensors(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(local_tensors(v) for v in tree)
    return tree
