# Copyright (c) mmnanguard contributors. All rights reserved.
"""A sigmoid focal loss that stays finite where ``mmdet.FocalLoss`` breaks.

``mmdet.FocalLoss`` computes ``sigmoid(x)`` and raises ``1 - p_t`` to the
power ``gamma``. For saturated logits ``1 - p_t`` is exactly zero, and the
gradient of ``pow`` there is ``inf * 0 = nan`` for ``gamma < 1``; under
autocast the logits arrive in fp16/bf16; with ``activated=True`` a
probability of exactly 0 or 1 meets a ``log``. :class:`StableFocalLoss`
computes every factor in the log domain from ``logsigmoid``, in fp32 with
autocast disabled.
"""

from typing import Optional, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from mmnanguard.registry import MODELS, register_shared

from .utils import safe_weight_reduce_loss

_REDUCTIONS = (None, 'none', 'mean', 'sum')


def _log_probs(
    pred: Tensor, activated: bool, eps: float
) -> Tuple[Tensor, Tensor]:
    """Return ``(log p, log(1 - p))`` in fp32.

    For logits, ``log p = logsigmoid(x)`` and ``log(1 - p) = log p - x``:
    exact, finite for every finite ``x``. For probabilities (``activated``),
    ``p`` is clamped to ``[eps, 1 - eps]`` first.
    """
    pred = pred.float()
    if activated:
        prob = pred.clamp(min=eps, max=1 - eps)
        return prob.log(), torch.log1p(-prob)
    log_p = F.logsigmoid(pred)
    return log_p, log_p - pred


def stable_sigmoid_focal_loss(
    pred: Tensor,
    target: Tensor,
    weight: Optional[Tensor] = None,
    gamma: float = 2.0,
    alpha: float = 0.25,
    reduction: str = 'mean',
    avg_factor: Optional[float] = None,
    activated: bool = False,
    eps: float = 1e-6,
) -> Tensor:
    """Sigmoid focal loss computed in the log domain, in fp32.

    Same value as mmdet's ``py_sigmoid_focal_loss`` (and, with
    ``activated=True``, ``py_focal_loss_with_prob``) wherever those are
    finite. The modulating factor ``(1 - p_t) ** gamma`` is computed as
    ``exp(gamma * log(1 - p_t))``, whose gradient is finite even where
    ``1 - p_t`` underflows to zero.

    Args:
        pred (Tensor): Logits (or probabilities if ``activated``), shape
            (N, C). Any floating dtype; computed in fp32.
        target (Tensor): Class indices of shape (N, ), where ``C`` means
            background, or targets of shape (N, C) in ``[0, 1]``.
        weight (Tensor, optional): Weight of shape (N, ), (N, C) or
            (N * C, ). Defaults to None.
        gamma (float): Focusing parameter. Defaults to 2.0.
        alpha (float): Balance of positives. Defaults to 0.25.
        reduction (str): 'none', 'mean' or 'sum'. Defaults to 'mean'.
        avg_factor (float, optional): Divisor of the 'mean' reduction.
            Defaults to None.
        activated (bool): Whether ``pred`` holds probabilities.
            Defaults to False.
        eps (float): Probabilities are clamped to ``[eps, 1 - eps]`` when
            ``activated``; unused for logits. Defaults to 1e-6.

    Returns:
        Tensor: The loss, in fp32.

    Raises:
        ValueError: If ``pred``, ``target`` and ``weight`` have shapes that
            do not fit together.
    """
    if pred.dim() != 2:
        raise ValueError(
            'stable_sigmoid_focal_loss: pred must have shape '
            f'(N, C), got {tuple(pred.shape)}'
        )
    num_classes = pred.size(1)
    log_p, log_1mp = _log_probs(pred, activated, eps)
    if target.dim() == 1:
        if target.size(0) != pred.size(0):
            raise ValueError(
                'stable_sigmoid_focal_loss: target of shape '
                f'{tuple(target.shape)} does not fit pred of shape '
                f'{tuple(pred.shape)}; expected (N, ) class indices'
            )
        # Class-index targets give a binary one-hot: select, don't blend.
        is_pos = F.one_hot(target.long(), num_classes + 1)[:, :num_classes]
        is_pos = is_pos.bool()
        nll = -torch.where(is_pos, log_p, log_1mp)
        log_1mpt = torch.where(is_pos, log_1mp, log_p)
        alpha_t = torch.where(is_pos, float(alpha), float(1 - alpha))
    elif target.shape == pred.shape:
        # Soft or one-hot targets: blend in the log domain (log 0 = -inf
        # contributes exp(-inf) = 0 to logaddexp and to its gradient).
        t = target.float()
        nll = -(t * log_p + (1 - t) * log_1mp)
        log_1mpt = torch.logaddexp(t.log() + log_1mp, torch.log1p(-t) + log_p)
        alpha_t = alpha * t + (1 - alpha) * (1 - t)
    else:
        raise ValueError(
            'stable_sigmoid_focal_loss: target must have shape (N, ) or '
            f'{tuple(pred.shape)}, got {tuple(target.shape)}'
        )
    loss = nll * alpha_t * torch.exp(gamma * log_1mpt)
    if weight is not None:
        weight = _fit_weight(weight, loss).float()
    return safe_weight_reduce_loss(loss, weight, reduction, avg_factor)


def _fit_weight(weight: Tensor, loss: Tensor) -> Tensor:
    """Reshape ``weight`` as mmdet's focal loss does, or raise."""
    if weight.shape == loss.shape:
        return weight
    if weight.dim() == 1 and weight.size(0) == loss.size(0):
        return weight.view(-1, 1)
    if weight.numel() == loss.numel():
        return weight.view(loss.size(0), -1)
    raise ValueError(
        f'StableFocalLoss: weight of shape {tuple(weight.shape)} fits '
        f'neither the loss shape {tuple(loss.shape)}, nor (N, ), nor N * C '
        'elements'
    )


@register_shared(MODELS)
class StableFocalLoss(nn.Module):
    """Drop-in for ``mmdet.FocalLoss`` that stays finite.

    It accepts every argument of ``mmdet.FocalLoss``, with the same target
    format (class indices where ``num_classes`` is background, or (N, C)
    targets). It computes from logits through ``logsigmoid``, in fp32 with
    autocast disabled, so loss and gradients stay finite for logits of
    ``±1e4``, for fp16/bf16 inputs, and for probabilities of exactly 0 and 1
    when ``activated=True``. The returned loss is fp32.

    What is clamped: with ``activated=True`` only, probabilities are
    clamped to ``[eps, 1 - eps]`` (gradient zero outside). Logits are never
    clamped.

    Args:
        use_sigmoid (bool): Must be True, as in mmdet. Defaults to True.
        gamma (float): Focusing parameter. Defaults to 2.0.
        alpha (float): Balance of positives. Defaults to 0.25.
        reduction (str): 'none', 'mean' or 'sum'. Defaults to 'mean'.
        loss_weight (float): Weight of the loss. Defaults to 1.0.
        activated (bool): Whether the inputs are probabilities.
            Defaults to False.
        eps (float): Clamp of probabilities when ``activated``.
            Defaults to 1e-6.

    Example:
        >>> # in an mmdet / mmrotate config, swap the type only:
        >>> loss_cls = dict(
        ...     type='StableFocalLoss', use_sigmoid=True, gamma=2.0,
        ...     alpha=0.25, loss_weight=1.0)
    """

    def __init__(
        self,
        use_sigmoid: bool = True,
        gamma: float = 2.0,
        alpha: float = 0.25,
        reduction: str = 'mean',
        loss_weight: float = 1.0,
        activated: bool = False,
        eps: float = 1e-6,
    ) -> None:
        super().__init__()
        if use_sigmoid is not True:
            raise ValueError(
                'StableFocalLoss: only use_sigmoid=True is '
                f'supported (as in mmdet), got {use_sigmoid!r}'
            )
        if reduction not in _REDUCTIONS[1:]:
            raise ValueError(
                'StableFocalLoss: reduction must be one of '
                f"'none', 'mean', 'sum', got {reduction!r}"
            )
        if gamma < 0:
            raise ValueError(
                f'StableFocalLoss: gamma must be >= 0, got ' f'{gamma!r}'
            )
        if not 0 < eps < 0.5:
            raise ValueError(
                f'StableFocalLoss: eps must lie in (0, 0.5), got {eps!r}'
            )
        self.use_sigmoid = use_sigmoid
        self.gamma = gamma
        self.alpha = alpha
        self.reduction = reduction
        self.loss_weight = loss_weight
        self.activated = activated
        self.eps = eps

    def forward(
        self,
        pred: Tensor,
        target: Tensor,
        weight: Optional[Tensor] = None,
        avg_factor: Optional[Union[int, float]] = None,
        reduction_override: Optional[str] = None,
    ) -> Tensor:
        """Compute the loss.

        Args:
            pred (Tensor): Logits (or probabilities if ``activated``) of
                shape (N, C).
            target (Tensor): Class indices (N, ) with background ``C``, or
                (N, C) targets.
            weight (Tensor, optional): Loss weight. Defaults to None.
            avg_factor (int | float, optional): Divisor of the mean.
                Defaults to None.
            reduction_override (str, optional): 'none', 'mean' or 'sum'.
                Defaults to None.

        Returns:
            Tensor: The weighted loss (fp32).
        """
        if reduction_override not in _REDUCTIONS:
            raise ValueError(
                'StableFocalLoss: reduction_override must be None, '
                f"'none', 'mean' or 'sum', got {reduction_override!r}"
            )
        reduction = reduction_override or self.reduction
        with torch.autocast(device_type=pred.device.type, enabled=False):
            loss = stable_sigmoid_focal_loss(
                pred,
                target,
                weight,
                gamma=self.gamma,
                alpha=self.alpha,
                reduction=reduction,
                avg_factor=avg_factor,
                activated=self.activated,
                eps=self.eps,
            )
        return self.loss_weight * loss
