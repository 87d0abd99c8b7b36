# Copyright (c) mmnanguard contributors. All rights reserved.
"""Loss reduction shared by the safe losses."""

from typing import Optional

from mmdet.models.losses.utils import weight_reduce_loss
from torch import Tensor


def safe_weight_reduce_loss(
    loss: Tensor,
    weight: Optional[Tensor] = None,
    reduction: str = 'mean',
    avg_factor: Optional[float] = None,
) -> Tensor:
    """mmdet's ``weight_reduce_loss``, except that the 'mean' of an empty
    loss is 0 instead of ``nan``.

    Args:
        loss (Tensor): Element-wise loss.
        weight (Tensor, optional): Element-wise weight. Defaults to None.
        reduction (str): 'none', 'mean' or 'sum'. Defaults to 'mean'.
        avg_factor (float, optional): Divisor of the mean. Defaults to None.

    Returns:
        Tensor: The reduced loss. An empty input reduces to a zero that is
        still connected to the graph.
    """
    if loss.numel() == 0 and reduction == 'mean' and avg_factor is None:
        reduction = 'sum'
    return weight_reduce_loss(loss, weight, reduction, avg_factor)
