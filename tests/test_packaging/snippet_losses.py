# Copyright (c) mmnanguard contributors. All rights reserved.
"""The user's loss that the docs' ``assert_loss_stable`` snippet tests: a
hand-written sigmoid focal loss that takes ``log(p)`` (the classic
``log(0)`` at saturated logits)."""

import torch
import torch.nn.functional as F
from mmdet.registry import MODELS
from torch import nn


@MODELS.register_module(force=True)
class MyLoss(nn.Module):
    """``-(1-p)^2 log p`` on the target class, ``-p^2 log(1-p)`` on the
    others, summed and divided by ``avg_factor`` (or the sample count).

    Args:
        loss_weight (float): Multiplies the loss. Defaults to 1.0.
    """

    def __init__(self, loss_weight: float = 1.0) -> None:
        super().__init__()
        self.loss_weight = loss_weight

    def forward(
        self,
        pred,
        target,
        weight=None,
        avg_factor=None,
        reduction_override=None,
    ):
        num_classes = pred.size(1)
        onehot = F.one_hot(target, num_classes + 1)[:, :num_classes]
        onehot = onehot.type_as(pred)
        p = pred.sigmoid()
        loss = -(
            onehot * (1 - p) ** 2 * torch.log(p)
            + (1 - onehot) * p**2 * torch.log(1 - p)
        )
        if weight is not None:
            loss = loss * (
                weight.reshape(-1, 1) if weight.dim() == 1 else weight
            )
        count = avg_factor if avg_factor is not None else max(pred.size(0), 1)
        return self.loss_weight * loss.sum() / count
