# Copyright (c) mmnanguard contributors. All rights reserved.
"""Dice loss that is finite and defined for empty masks.

``mmdet.DiceLoss`` and ``mmseg.DiceLoss`` divide by sums over the mask.
With ``eps=0`` an empty ground truth and an all-zero prediction give
``0 / 0``; in fp16 the sums overflow to ``inf`` (65504 is about a 256 x 256
mask) and give ``inf / inf``. :class:`SafeDiceLoss` sums in fp32 with
autocast disabled, and defines the 0/0 case.
"""

from typing import Optional, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from mmnanguard.registry import MODELS, register_shared

from .checked_cross_entropy_loss import check_cross_entropy_labels
from .utils import safe_weight_reduce_loss

_REDUCTIONS = (None, 'none', 'mean', 'sum')


def safe_dice_loss(
    pred: Tensor,
    target: Tensor,
    weight: Optional[Tensor] = None,
    eps: float = 1e-3,
    reduction: str = 'mean',
    naive_dice: bool = False,
    avg_factor: Optional[float] = None,
    valid_mask: Optional[Tensor] = None,
) -> Tensor:
    """Dice loss per sample, in fp32, defined when a mask sum is zero.

    With ``a = sum(p t)``, ``b``, ``c`` the sums of ``p`` and ``t`` (naive)
    or of their squares (V-Net, default)::

        naive: d = (2a + eps) / (b + c + eps)
        V-Net: d = 2a / (b + c + 2 eps)
        loss  = 1 - d

    which is mmdet's and mmseg's formula. Where the denominator is zero
    (only possible with ``eps=0``: empty ground truth and all-zero
    prediction) the prediction is perfect and the loss is defined as 0,
    with zero gradient; the division uses a safe denominator so the
    gradient stays finite.

    Args:
        pred (Tensor): Activated prediction, shape (N, *).
        target (Tensor): Target of the same shape.
        weight (Tensor, optional): Per-sample weight (N, ). Defaults to None.
        eps (float): Smoothing term, >= 0. Defaults to 1e-3.
        reduction (str): 'none', 'mean' or 'sum'. Defaults to 'mean'.
        naive_dice (bool): Use first powers in the denominator.
            Defaults to False.
        avg_factor (float, optional): Divisor of the mean. Defaults to None.
        valid_mask (Tensor, optional): Elements to count, same shape as
            ``pred``; others are excluded from every sum. Defaults to None.

    Returns:
        Tensor: The loss (fp32).
    """
    pred = pred.float().flatten(1)
    target = target.float().flatten(1)
    if valid_mask is not None:
        valid = valid_mask.flatten(1).float()
        pred = pred * valid
        target = target * valid
    a = torch.sum(pred * target, 1)
    if naive_dice:
        num = 2 * a + eps
        den = pred.sum(1) + target.sum(1) + eps
    else:
        num = 2 * a
        den = (pred * pred).sum(1) + (target * target).sum(1) + 2 * eps
    defined = den > 0
    dice = torch.where(defined, num / torch.where(defined, den, 1.0), 1.0)
    loss = 1 - dice
    if weight is not None:
        if weight.shape != loss.shape:
            raise ValueError(
                f'SafeDiceLoss: weight must have shape {tuple(loss.shape)} '
                f'(one per sample), got {tuple(weight.shape)}'
            )
        weight = weight.float()
    return safe_weight_reduce_loss(loss, weight, reduction, avg_factor)


@register_shared(MODELS)
class SafeDiceLoss(nn.Module):
    """Drop-in for ``mmdet.DiceLoss`` and ``mmseg.DiceLoss``.

    Accepts the arguments of both and returns what the one it replaces
    returns wherever that is finite; finite loss and gradients when the
    ground truth of an image or class is empty, when the prediction is all
    zero (with any ``eps >= 0``), and for fp16/bf16 inputs or under
    autocast (sums in fp32). The loss of an empty ground truth with an
    all-zero prediction is 0 when ``eps=0`` (``1`` under V-Net's formula
    with ``eps > 0``, exactly as upstream).

    Targets: a tensor of the same shape as ``pred`` (mmdet's masks), or
    (mmseg) class indices (N, H, W), one-hot encoded as mmseg does: labels
    are clamped into ``[0, C]``, so a label ``>= C`` (such as 255) has an
    all-zero target while the prediction on it still counts.
    ``exclude_ignored=True`` instead leaves pixels labelled
    ``ignore_index`` out of every sum and refuses other labels outside
    ``[0, C)`` with a ``ValueError`` naming them. For (N, C, H, W)
    predictions, if ``ignore_index`` is a channel index, that channel is
    dropped, as mmseg does (mmdet's (N, P) or (N, H, W) masks have no class
    dimension and keep every element). As in mmseg, the constructor's
    ``ignore_index`` is the one used; ``forward``'s is accepted and
    ignored.

    Args:
        use_sigmoid (bool): Sigmoid (True) or softmax over dim 1 (False;
            mmdet raises ``NotImplementedError`` there). Defaults to True.
        activate (bool): Whether to activate ``pred``. Defaults to True.
        reduction (str): 'none', 'mean' or 'sum'. Defaults to 'mean'.
        naive_dice (bool): First powers in the denominator.
            Defaults to False.
        loss_weight (float): Weight of the loss. Defaults to 1.0.
        ignore_index (int, optional): Ignored label / channel (mmseg).
            Defaults to 255.
        eps (float): Smoothing term, >= 0. Defaults to 1e-3.
        loss_name (str): Name of the loss item (mmseg).
            Defaults to 'loss_dice'.
        exclude_ignored (bool): Leave ``ignore_index`` pixels of index
            targets out of the sums and refuse out-of-range labels (see
            above). Defaults to False.
    """

    def __init__(
        self,
        use_sigmoid: bool = True,
        activate: bool = True,
        reduction: str = 'mean',
        naive_dice: bool = False,
        loss_weight: float = 1.0,
        ignore_index: Optional[int] = 255,
        eps: float = 1e-3,
        loss_name: str = 'loss_dice',
        exclude_ignored: bool = False,
    ) -> None:
        super().__init__()
        if eps < 0:
            raise ValueError(f'SafeDiceLoss: eps must be >= 0, got {eps!r}')
        if reduction not in _REDUCTIONS[1:]:
            raise ValueError(
                "SafeDiceLoss: reduction must be 'none', "
                f"'mean' or 'sum', got {reduction!r}"
            )
        self.use_sigmoid = use_sigmoid
        self.activate = activate
        self.reduction = reduction
        self.naive_dice = naive_dice
        self.loss_weight = loss_weight
        self.ignore_index = ignore_index
        self.eps = eps
        self._loss_name = loss_name
        self.exclude_ignored = exclude_ignored

    def forward(
        self,
        pred: Tensor,
        target: Tensor,
        weight: Optional[Tensor] = None,
        avg_factor: Optional[Union[int, float]] = None,
        reduction_override: Optional[str] = None,
        ignore_index: Optional[int] = None,
    ) -> Tensor:
        """Compute the loss.

        Pass ``avg_factor`` and ``reduction_override`` by keyword: mmdet
        and mmseg order them differently (every caller in mmdet and mmseg
        passes them by keyword).

        Args:
            pred (Tensor): Prediction (N, *) or (N, C, H, W).
            target (Tensor): Same shape as ``pred``, or (N, H, W) indices.
            weight (Tensor, optional): Per-sample weight (N, ).
                Defaults to None.
            avg_factor (int | float, optional): Divisor of the mean.
                Defaults to None.
            reduction_override (str, optional): 'none', 'mean' or 'sum'.
                Defaults to None.
            ignore_index (int, optional): Accepted for mmseg's signature
                and not used (mmseg uses the constructor's too).
                Defaults to None.

        Returns:
            Tensor: The loss (fp32).
        """
        if reduction_override not in _REDUCTIONS:
            raise ValueError(
                'SafeDiceLoss: reduction_override must be None, '
                f"'none', 'mean' or 'sum', got {reduction_override!r}"
            )
        reduction = reduction_override or self.reduction
        ignore_index = self.ignore_index
        with torch.autocast(device_type=pred.device.type, enabled=False):
            pred = pred.float()
            if self.activate:
                if self.use_sigmoid:
                    pred = pred.sigmoid()
                elif pred.size(1) != 1:
                    pred = pred.softmax(dim=1)
            valid_mask = None
            if pred.shape != target.shape:
                target, valid_mask = self._one_hot(pred, target, ignore_index)
            num_classes = pred.size(1)
            if (
                ignore_index is not None
                and pred.dim() == 4
                and 0 <= ignore_index < num_classes
            ):
                keep = torch.arange(num_classes, device=pred.device)
                keep = keep != ignore_index
                pred, target = pred[:, keep], target[:, keep]
                if valid_mask is not None:
                    valid_mask = valid_mask[:, keep]
            loss = safe_dice_loss(
                pred,
                target,
                weight,
                eps=self.eps,
                reduction=reduction,
                naive_dice=self.naive_dice,
                avg_factor=avg_factor,
                valid_mask=valid_mask,
            )
        return self.loss_weight * loss

    def _one_hot(
        self, pred: Tensor, target: Tensor, ignore_index: Optional[int]
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """One-hot (N, H, W) indices to (N, C, H, W), and the mask of the
        elements to count (None: all)."""
        if target.dim() != pred.dim() - 1 or target.is_floating_point():
            raise ValueError(
                'SafeDiceLoss: target must have the shape of pred '
                f'{tuple(pred.shape)} or be integer indices of shape '
                f'{tuple(pred.shape[:1] + pred.shape[2:])}, got '
                f'{tuple(target.shape)} ({target.dtype})'
            )
        num_classes = pred.size(1)
        if not self.exclude_ignored:
            index = target.long().clamp(min=0, max=num_classes)
            one_hot = F.one_hot(index, num_classes + 1)[..., :num_classes]
            return one_hot.movedim(-1, 1), None
        check_cross_entropy_labels(
            target, num_classes, ignore_index, 'SafeDiceLoss'
        )
        valid = torch.ones_like(target, dtype=torch.bool)
        if ignore_index is not None:
            valid = target != ignore_index
        index = torch.where(valid, target, 0)
        one_hot = F.one_hot(index.long(), num_classes + 1)[..., :num_classes]
        one_hot = one_hot.movedim(-1, 1)
        valid = valid.unsqueeze(1).expand_as(one_hot)
        return one_hot, valid

    @property
    def loss_name(self) -> str:
        """Name of the loss item (mmseg convention)."""
        return self._loss_name
