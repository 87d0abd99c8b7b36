# Copyright (c) mmnanguard contributors. All rights reserved.
"""The label check for a class-label cross-entropy of any toolbox.

mmdet's and mmseg's ``CrossEntropyLoss`` are wrapped by
:class:`~mmnanguard.models.losses.CheckedCrossEntropyLoss`
(:mod:`.label_checks`). Every other loss module of the built model
(mmpretrain's, mmpose's, a user's own) is tried once as a softmax
cross-entropy, by its values, not its name: called as
``loss(scores, labels)`` on two small batches, its value
must be the same positive multiple (its ``loss_weight``) of torch's
``F.cross_entropy`` on both, as a mean or a sum (the trial runs on a
copy of the module on the CPU). Such a module takes class
indices the way cross-entropy does; a forward pre-hook then checks the
labels of each call (``[0, C)`` for scores of ``C`` channels, or the
module's ``ignore_index``, else torch's -100) before it runs, and raises
:class:`~mmnanguard.models.losses.InvalidLabelError` naming the value and
the module. The module itself is not changed (no wrapper, same class and
state dict). A loss that raises on the trial, returns something else, or
weighs classes is left alone.
"""

import copy
import math
from typing import Any, Callable, List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmnanguard.config_walk import is_loss_class
from mmnanguard.models.losses import CheckedCrossEntropyLoss
from mmnanguard.models.losses.checked_cross_entropy_loss import (
    check_cross_entropy_labels,
)

from .label_checks import upstream_cross_entropy_types

#: Loss modules holding more parameter and buffer elements than this are
#: not tried (a perceptual loss holds a network; a cross-entropy holds at
#: most its class weights).
MAX_TRIAL_NUMEL = 1 << 20

#: torch's ``F.cross_entropy`` default ``ignore_index``.
TORCH_IGNORE = -100

#: The trial batches: scores of 3 classes and two label sets.
_SCORES = [[2.0, -1.0, 0.5], [0.1, 0.3, -2.0], [-0.7, 1.2, 0.4]]
_LABELS = ([0, 2, 1], [1, 1, 0])


def _ratio(value: Any, reference: Tensor) -> Optional[float]:
    if not isinstance(value, Tensor) or value.numel() != reference.numel():
        return None
    value = value.detach().double().reshape(-1)
    ratios = value / reference.reshape(-1)
    first = float(ratios[0])
    if not (math.isfinite(first) and first > 0):
        return None
    if not torch.allclose(ratios, torch.full_like(ratios, first)):
        return None
    return first


def is_class_label_cross_entropy(module: nn.Module) -> bool:
    """Whether ``module(scores, labels)`` is a fixed positive multiple of
    ``F.cross_entropy(scores, labels)`` (per sample, mean or sum) on two
    trial batches.

    The trial calls a copy of ``module`` on the CPU, so that a kernel that
    refuses the trial raises there instead of failing on the device.
    """
    held = sum(t.numel() for t in module.parameters())
    if held + sum(t.numel() for t in module.buffers()) > MAX_TRIAL_NUMEL:
        return False  # a loss with a network inside: not a cross-entropy
    try:
        module = copy.deepcopy(module).cpu()
    except Exception:  # noqa: BLE001  (cannot be tried: left alone)
        return False
    scores = torch.tensor(_SCORES, dtype=torch.float64)
    ratios = []
    for labels in _LABELS:
        target = torch.tensor(labels)
        per_sample = F.cross_entropy(scores, target, reduction='none')
        try:
            with torch.no_grad():
                value = module(scores.float(), target)
        except Exception:  # noqa: BLE001  (not a cross-entropy of this form)
            return False
        for reference in (per_sample, per_sample.mean(), per_sample.sum()):
            ratio = _ratio(value, reference)
            if ratio is not None:
                ratios.append(ratio)
                break
        else:
            return False
    return math.isclose(ratios[0], ratios[1], rel_tol=1e-5)


def _label_check(path: str) -> Callable[..., None]:
    def hook(module: nn.Module, args: Any, kwargs: Any) -> None:
        scores = args[0] if args else kwargs.get('cls_score')
        label = args[1] if len(args) > 1 else kwargs.get('label')
        if label is None:
            label = kwargs.get('target')
        if not (isinstance(scores, Tensor) and isinstance(label, Tensor)):
            return
        if (
            scores.dim() < 2
            or label.dim() != scores.dim() - 1
            or label.is_floating_point()
            or label.is_complex()
        ):
            return  # soft or one-hot targets: not class indices
        ignore = getattr(module, 'ignore_index', None)
        check_cross_entropy_labels(
            label,
            scores.size(1),
            ignore if isinstance(ignore, int) else TORCH_IGNORE,
            name=f'{type(module).__name__} at {path}',
        )

    return hook


def hook_cross_entropy(model: nn.Module) -> List[str]:
    """Put the label check on every other class-label cross-entropy of
    ``model`` (see the module docstring): mmdet's and mmseg's, which
    :func:`~.label_checks.wrap_cross_entropy` wraps or leaves alone on
    purpose (mask losses), are not tried. A loss inside a loss that is
    not a cross-entropy itself is tried in turn (mmocr's ``CEModuleLoss``
    takes the decoder's outputs and data samples, and holds the
    ``nn.CrossEntropyLoss`` that gets the character indices).

    Args:
        model (nn.Module): The built model.

    Returns:
        list[str]: The paths of the modules checked now.
    """
    upstream = (CheckedCrossEntropyLoss, *upstream_cross_entropy_types())
    hooked: List[str] = []
    settled: List[str] = []  # hooked or upstream: nothing inside is tried
    for name, module in model.named_modules():
        if not is_loss_class(type(module)):
            continue
        if any(name.startswith(f'{outer}.') for outer in settled):
            continue
        path = f'model.{name}' if name else 'model'
        if isinstance(module, upstream) or getattr(
            module, '_nanguard_label_check', False
        ):
            settled.append(name)
            continue
        if not is_class_label_cross_entropy(module):
            continue
        module.register_forward_pre_hook(_label_check(path), with_kwargs=True)
        module._nanguard_label_check = True
        settled.append(name)
        hooked.append(path)
    return hooked
