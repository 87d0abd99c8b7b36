# Copyright (c) mmnanguard contributors. All rights reserved.
"""A sigmoid focal loss that stays finite where ``mmdet.FocalLoss`` breaks.

``mmdet.FocalLoss`` computes ``sigmoid(x)`` and raises ``1 - p_t`` to the
power ``gamma``. For saturated logits ``1 - p_t`` is exactly zero, and the
gradient of ``pow`` there is ``inf * 0 = nan`` for ``gamma < 1``; under
autocast the logits arrive in fp16/bf16; with ``activated=True`` a
probability of exactly 0 or 1 meets the same ``pow``.
:class:`StableFocalLoss` computes the modulating factor in the log domain
(from ``logsigmoid`` for logits), in fp32 with autocast disabled, and
returns mmdet's value wherever mmdet's is finite.
"""

from typing import Optional, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from mmnanguard.registry import MODELS, register_shared

from .utils import safe_weight_reduce_loss

_REDUCTIONS = (None, 'none', 'mean', 'sum')


def _logit_terms(
    logits: Tensor, target: Tensor, alpha: float
) -> Tuple[Tensor, Tensor, Tensor]:
    """``(nll, log(1 - p_t), alpha_t)`` from logits, in fp32.

    ``log p = logsigmoid(x)`` and ``log(1 - p) = log p - x``: exact and
    finite for every finite ``x``. Class-index targets give a binary
    one-hot (select, don't blend); soft targets blend in the log domain
    (``log 0 = -inf`` contributes ``exp(-inf) = 0`` to ``logaddexp`` and to
    its gradient).
    """
    log_p = F.logsigmoid(logits)
    log_1mp = log_p - logits
    if target.dtype == torch.bool:
        nll = -torch.where(target, log_p, log_1mp)
        log_1mpt = torch.where(target, log_1mp, log_p)
        alpha_t = torch.where(target, float(alpha), float(1 - alpha))
        return nll, log_1mpt, alpha_t
    t = target.float()
    nll = -(t * log_p + (1 - t) * log_1mp)
    log_1mpt = torch.logaddexp(t.log() + log_1mp, torch.log1p(-t) + log_p)
    return nll, log_1mpt, alpha * t + (1 - alpha) * (1 - t)


def _prob_terms(
    prob: Tensor, target: Tensor, alpha: float, eps: float
) -> Tuple[Tensor, Tensor, Tensor]:
    """``(nll, log(1 - p_t), alpha_t)`` from probabilities, in fp32.

    ``nll`` is ``F.binary_cross_entropy`` (upstream's value, its log
    clamped at -100, and its gradient, except at exactly 0 and 1, where
    the clamped value is flat and no BCE gradient flows). ``1 - p_t`` is
    floored at the smallest normal float before the ``log``, so the
    modulating factor's gradient stays finite where it is 0.
    """
    if eps > 0:
        prob = prob.clamp(min=eps, max=1 - eps)
    t = target.float()
    nll = F.binary_cross_entropy(prob, t, reduction='none')
    # At p = 0 and 1 BCE's backward divides by a 1e-12 floor (~1e12, inf
    # on the way back to an fp16 input), while for a 0/1 target the value
    # is flat there (the log is clamped at -100, or its weight is 0): no
    # BCE gradient at those points, the value is kept. (A soft target
    # loses its unclamped term's gradient there: 1 - t at 0, -t at 1.)
    saturated = (prob == 0) | (prob == 1)
    nll = torch.where(saturated, nll.detach(), nll)
    one_m_pt = (1 - prob) * t + prob * (1 - t)
    log_1mpt = one_m_pt.clamp(min=torch.finfo(torch.float32).tiny).log()
    return nll, log_1mpt, alpha * t + (1 - alpha) * (1 - t)


def stable_sigmoid_focal_loss(
    pred: Tensor,
    target: Tensor,
    weight: Optional[Tensor] = None,
    gamma: float = 2.0,
    alpha: float = 0.25,
    reduction: str = 'mean',
    avg_factor: Optional[float] = None,
    activated: bool = False,
    eps: float = 0.0,
) -> Tensor:
    """Sigmoid focal loss computed in the log domain, in fp32.

    Same value as mmdet's ``py_sigmoid_focal_loss`` (and, with
    ``activated=True``, ``py_focal_loss_with_prob``) wherever those are
    finite. The modulating factor ``(1 - p_t) ** gamma`` is computed as
    ``exp(gamma * log(1 - p_t))``, whose gradient is finite even where
    ``1 - p_t`` underflows to zero.

    Args:
        pred (Tensor): Logits (or probabilities if ``activated``), shape
            (N, C), or any shape with targets of the same shape (mmdet's
            one-hot (N, C, H, W) form). Any floating dtype; computed in
            fp32.
        target (Tensor): Class indices of shape (N, ), where ``C`` means
            background, or targets of the shape of ``pred`` in ``[0, 1]``.
        weight (Tensor, optional): Weight of shape (N, ), (N, C) or
            (N * C, ) for (N, C) predictions, else of the shape of the
            loss. Defaults to None.
        gamma (float): Focusing parameter. Defaults to 2.0.
        alpha (float): Balance of positives. Defaults to 0.25.
        reduction (str): 'none', 'mean' or 'sum'. Defaults to 'mean'.
        avg_factor (float, optional): Divisor of the 'mean' reduction.
            Defaults to None.
        activated (bool): Whether ``pred`` holds probabilities.
            Defaults to False.
        eps (float): If > 0, probabilities are clamped to
            ``[eps, 1 - eps]`` when ``activated`` (a regularisation that
            changes the value; upstream has none); unused for logits.
            Defaults to 0.

    Returns:
        Tensor: The loss, in fp32.

    Raises:
        ValueError: If ``pred``, ``target`` and ``weight`` have shapes that
            do not fit together.
    """
    if target.dim() == 1 and target.shape != pred.shape:
        if pred.dim() != 2 or target.size(0) != pred.size(0):
            raise ValueError(
                'stable_sigmoid_focal_loss: class-index targets of shape '
                f'{tuple(target.shape)} need pred of shape (N, C) with the '
                f'same N, got {tuple(pred.shape)}'
            )
        num_classes = pred.size(1)
        target = F.one_hot(target.long(), num_classes + 1)[:, :num_classes]
        target = target.bool()
    elif target.shape != pred.shape:
        raise ValueError(
            'stable_sigmoid_focal_loss: target must be class indices of '
            f'shape (N, ) or have the shape of pred {tuple(pred.shape)}, '
            f'got {tuple(target.shape)}'
        )
    if activated:
        terms = _prob_terms(pred.float(), target, alpha, eps)
    else:
        terms = _logit_terms(pred.float(), target, alpha)
    nll, log_1mpt, alpha_t = terms
    loss = nll * alpha_t * torch.exp(gamma * log_1mpt)
    if weight is not None:
        weight = _fit_weight(weight, loss).float()
    return safe_weight_reduce_loss(loss, weight, reduction, avg_factor)


def _fit_weight(weight: Tensor, loss: Tensor) -> Tensor:
    """Reshape ``weight`` as mmdet's focal loss does, or raise."""
    if weight.shape == loss.shape:
        return weight
    if loss.dim() == 2:
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

    Nothing is clamped by default: logits never, and probabilities
    (``activated=True``) only with ``eps > 0``, an explicit regularisation
    that changes the value where upstream's is finite.

    Args:
        use_sigmoid (bool): Must be True, as in mmdet. Defaults to True.
        gamma (float): Focusing parameter. Defaults to 2.0.
        alpha (float): Balance of positives. Defaults to 0.25.
        reduction (str): 'none', 'mean' or 'sum'. Defaults to 'mean'.
        loss_weight (float): Weight of the loss. Defaults to 1.0.
        activated (bool): Whether the inputs are probabilities.
            Defaults to False.
        eps (float): If > 0, clamp probabilities to ``[eps, 1 - eps]``
            when ``activated``. Defaults to 0.

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
        eps: float = 0.0,
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
        if not 0 <= eps < 0.5:
            raise ValueError(
                f'StableFocalLoss: eps must lie in [0, 0.5), got {eps!r}'
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
                shape (N, C), or of any shape with a target of that shape.
            target (Tensor): Class indices (N, ) with background ``C``, or
                targets of the shape of ``pred``.
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
