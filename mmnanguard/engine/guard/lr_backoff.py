# Copyright (c) mmnanguard contributors. All rights reserved.
"""Multiply every learning rate by a factor (after a rollback)."""
from typing import List, Tuple

from mmnanguard.engine.optimizers.guarded_optim_wrapper import \
    optim_wrapper_members


def scale_learning_rates(optim_wrapper,
                         factor: float) -> List[Tuple[float, float]]:
    """Multiply ``lr`` of every param group of every optimizer by ``factor``.

    mmengine's param schedulers read the current ``group['lr']`` and update
    it multiplicatively (``LinearLR``, ``MultiStepLR``, ``ExponentialLR``,
    ...), so the backoff carries through the rest of the schedule.

    Args:
        optim_wrapper (OptimWrapper | OptimWrapperDict): The runner's.
        factor (float): In (0, 1].

    Returns:
        list[tuple]: ``(lr_before, lr_after)`` per param group.
    """
    changes = []
    for wrapper in optim_wrapper_members(optim_wrapper):
        for group in wrapper.optimizer.param_groups:
            before = group['lr']
            group['lr'] = before * factor
            changes.append((before, group['lr']))
    return changes
