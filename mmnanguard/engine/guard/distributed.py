# Copyright (c) mmnanguard contributors. All rights reserved.
"""Every rank reaches the same decision before anyone acts."""

import torch
from mmengine import dist


def any_rank(flag: bool) -> bool:
    """Whether ``flag`` is True on at least one rank.

    Under ``torch.distributed`` it is an ``all_reduce`` of one number, which
    every rank must call at the same point; otherwise it returns ``flag``.

    Args:
        flag (bool): This rank's verdict.

    Returns:
        bool: The verdict all ranks agree on.
    """
    if dist.get_world_size() == 1:
        return flag
    votes = torch.tensor([1.0 if flag else 0.0])
    dist.all_reduce(votes, op='sum')
    return bool(votes.item() > 0)
