# Copyright (c) mmnanguard contributors. All rights reserved.
"""Which input kind a loss takes, decided from its built class (module,
name, forward signature), and the cases of each kind."""

import inspect
from typing import Callable, Dict, List, Optional

import torch.nn as nn

from .angle import angle_cases
from .boxes import box_cases, quad_cases, rotated_box_cases
from .case import BatteryContext, LossCase
from .classification import classification_cases
from .gaussian import gaussian_cases
from .masks import mask_cases, segmentation_cases

#: Input kind -> the function that makes its cases.
KIND_CASES: Dict[str, Callable[[BatteryContext], List[LossCase]]] = {
    'classification': classification_cases,
    'box': box_cases,
    'rotated_box': rotated_box_cases,
    'quad': quad_cases,
    'angle': angle_cases,
    'mask': mask_cases,
    'segmentation': segmentation_cases,
    'gaussian': gaussian_cases,
}
KINDS = tuple(KIND_CASES)
_REGRESSION = ('l1', 'mse', 'smooth', 'balanced', 'l2', 'huber')


def _names(cls: type) -> str:
    """Lower-case class names of the mro (up to ``nn.Module``) and the
    defining modules, for matching."""
    parts = []
    for base in cls.__mro__:
        if base is nn.Module:
            break
        parts += [base.__name__.lower(), base.__module__.lower()]
    return ' '.join(parts)


def _first_arg(loss: nn.Module) -> str:
    """Name of the first argument of ``loss.forward``."""
    params = list(inspect.signature(loss.forward).parameters)
    return params[0] if params else ''


def infer_kind(loss: nn.Module, scope: Optional[str] = None) -> str:
    """The input kind of ``loss`` (one of :data:`KINDS`).

    Decided from the built class: its mro's names and modules, its
    ``impl`` / ``use_mask`` attributes and its forward signature; a loss
    that serves both detection and segmentation (our ``SafeDiceLoss``)
    follows ``scope``.

    Args:
        loss (nn.Module): The built loss.
        scope (str, optional): The config's default scope.

    Returns:
        str: The kind.

    Raises:
        ValueError: The kind cannot be told; pass it explicitly.
    """
    names, first = _names(type(loss)), _first_arg(loss)
    top = type(loss).__module__.split('.')[0]
    seg = (
        top == 'mmseg'
        or getattr(loss, 'impl', None) == 'mmseg'
        or first in ('seg_logit', 'seg_logits')
    )
    if 'gaussian' in names or 'gdloss' in names or 'kld' in names:
        return 'gaussian'
    if 'convex' in names:
        return 'quad'
    if 'iou' in names:
        return 'rotated_box' if 'rotated' in names else 'box'
    if getattr(loss, 'use_mask', False):
        return 'mask'
    if 'dice' in names:
        return 'segmentation' if seg or scope == 'mmseg' else 'mask'
    if seg:
        return 'segmentation'
    if 'focal' in names or 'cross_entropy' in names or first == 'cls_score':
        return 'classification'
    if any(word in names for word in _REGRESSION):
        return 'box'
    raise ValueError(
        f'cannot tell the input kind of {type(loss).__name__} (from '
        f'{type(loss).__module__}); pass kind= one of {KINDS}'
    )


def context_for(loss: nn.Module, **settings) -> BatteryContext:
    """A :class:`BatteryContext` read off the built loss.

    Args:
        loss (nn.Module): The built loss (``use_sigmoid``, ``activated``
            and ``activate`` are read off it; a loss without
            ``use_sigmoid`` is taken as softmax, labels in ``[0, C)``).
        **settings: ``num_classes``, ``angle_version``, ``ignore_index``
            (None values are left at their defaults).

    Returns:
        BatteryContext: The context.
    """
    given = {k: v for k, v in settings.items() if v is not None}
    takes_probs = bool(getattr(loss, 'activated', False)) or (
        getattr(loss, 'activate', True) is False
    )
    return BatteryContext(
        use_sigmoid=bool(getattr(loss, 'use_sigmoid', False)),
        takes_probabilities=takes_probs,
        quality_targets='qualityfocal' in _names(type(loss)),
        **given,
    )
