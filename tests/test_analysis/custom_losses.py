# Copyright (c) mmnanguard contributors. All rights reserved.
"""Two deliberately broken custom losses, as users write them, registered
for the battery's tests."""

import torch
import torch.nn as nn
from mmengine.registry import MODELS


@MODELS.register_module(force=True)
class HandWrittenCELoss(nn.Module):
    """Cross-entropy as ``-(t * log(softmax(x)))``: ``log`` of a softmax
    that underflows to 0 is ``-inf``, and ``0 * -inf`` is NaN."""

    def __init__(self, loss_weight: float = 1.0) -> None:
        super().__init__()
        self.loss_weight = loss_weight

    def forward(self, cls_score, label, weight=None, avg_factor=None):
        num_classes = cls_score.size(1)
        target = nn.functional.one_hot(label, num_classes).to(cls_score)
        loss = -(target * torch.log(torch.softmax(cls_score, 1))).sum(1)
        return self.loss_weight * loss.mean()


@MODELS.register_module(force=True)
class ZeroDenominatorDiceLoss(nn.Module):
    """Dice ``1 - 2 |p t| / (|p| + |t|)`` without smoothing: an empty mask
    with an all-zero prediction is ``0 / 0``."""

    def __init__(self, loss_weight: float = 1.0) -> None:
        super().__init__()
        self.loss_weight = loss_weight

    def forward(self, pred, target, weight=None, avg_factor=None):
        pred = pred.flatten(1).sigmoid()
        target = target.flatten(1).float()
        inter = (pred * target).sum(1)
        dice = 2 * inter / (pred.sum(1) + target.sum(1))
        return self.loss_weight * (1 - dice).mean()
