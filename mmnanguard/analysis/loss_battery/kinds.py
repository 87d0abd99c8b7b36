# Copyright (c) mmnanguard contributors. All rights reserved.
"""Which input kind a loss takes, decided by calling the built module
(:mod:`mmnanguard.models.loss_kind`), and the cases of each kind."""

from typing import Callable, Dict, List, Optional

import torch.nn as nn

from mmnanguard.models.loss_kind import LossKind, loss_kind

from .angle import angle_cases
from .boxes import box_cases, quad_cases, rotated_box_cases
from .case import BatteryContext, LossCase
from .classification import classification_cases
from .ctc import ctc_cases
from .distribution import distribution_cases
from .gaussian import gaussian_cases
from .masks import mask_cases, segmentation_cases

#: Input kind -> the function that makes its cases.
KIND_CASES: Dict[str, Callable[[BatteryContext], List[LossCase]]] = {
    'classification': classification_cases,
    'distribution': distribution_cases,
    'box': box_cases,
    'rotated_box': rotated_box_cases,
    'quad': quad_cases,
    'angle': angle_cases,
    'mask': mask_cases,
    'segmentation': segmentation_cases,
    'gaussian': gaussian_cases,
    'ctc': ctc_cases,
}
KINDS = tuple(KIND_CASES)
#: Kinds of :func:`~mmnanguard.models.loss_kind.loss_kind` run through the
#: cases of another: an element-wise regression loss gets the box cases.
_BATTERY_OF = {'regression': 'box'}


def _decided(loss: nn.Module, scope: Optional[str]) -> LossKind:
    """:func:`loss_kind`, its error ending with the explicit way out."""
    try:
        return loss_kind(loss, scope)
    except ValueError as err:
        raise ValueError(f'{err}; pass kind= one of {KINDS}') from None


def infer_kind(loss: nn.Module, scope: Optional[str] = None) -> str:
    """The input kind of ``loss`` (one of :data:`KINDS`).

    Decided by calling the built module on probe inputs of each form
    (:func:`mmnanguard.models.loss_kind.loss_kind`), not from its name: a
    ``DistributionFocalLoss`` takes distributions, an ``L1Loss`` gets the
    box cases; a per-pixel loss is read off the built module (``use_mask``,
    mmseg's), a Dice loss follows ``scope``; torch's ``CTCLoss`` takes
    sequences (``'ctc'``).

    Args:
        loss (nn.Module): The built loss.
        scope (str, optional): The config's default scope.

    Returns:
        str: The kind.

    Raises:
        ValueError: The kind cannot be told; pass it explicitly.
    """
    if isinstance(loss, nn.CTCLoss):  # takes sequences: no probe form
        return 'ctc'
    kind = _decided(loss, scope).kind
    return _BATTERY_OF.get(kind, kind)


def context_for(loss: nn.Module, **settings) -> BatteryContext:
    """A :class:`BatteryContext` read off the built loss.

    Args:
        loss (nn.Module): The built loss (``use_sigmoid``, ``activated``
            and ``activate`` are read off it; a loss without
            ``use_sigmoid`` is taken as softmax, labels in ``[0, C)``; the
            form of its targets is probed).
        **settings: ``num_classes``, ``angle_version``, ``ignore_index``
            (None values are left at their defaults).

    Returns:
        BatteryContext: The context.
    """
    given = {k: v for k, v in settings.items() if v is not None}
    takes_probs = bool(getattr(loss, 'activated', False)) or (
        getattr(loss, 'activate', True) is False
    )
    try:
        targets = loss_kind(loss).targets
    except ValueError:
        targets = ''
    blank = getattr(loss, 'blank', 0)
    return BatteryContext(
        blank=blank if isinstance(blank, int) else 0,
        use_sigmoid=bool(getattr(loss, 'use_sigmoid', False)),
        takes_probabilities=takes_probs,
        quality_targets=targets.startswith('(class indices, quality'),
        one_hot_targets=targets.startswith('one-hot'),
        **given,
    )
