# Copyright (c) mmnanguard contributors. All rights reserved.
"""One adversarial input of the loss battery, and what it needs to know
about the loss it is built for."""

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor

#: The groups of the battery, in the order they are printed.
GROUPS = (
    'nominal',
    'empty',
    'predictions',
    'degenerate boxes',
    'labels',
    'precision',
    'weights',
)

Inputs = Tuple[List[Any], Dict[str, Any]]


@dataclass
class BatteryContext:
    """What the inputs of a loss depend on.

    Args:
        num_classes (int): Number of classes (the head's). Defaults to 4.
        angle_version (str): 'oc', 'le90' or 'le135'. Defaults to 'le90'.
        ignore_index (int): Ignored label of segmentation maps.
            Defaults to 255.
        use_sigmoid (bool): Whether classification targets have a
            background label ``num_classes``. Defaults to True.
        takes_probabilities (bool): Whether the loss takes probabilities
            instead of logits. Defaults to False.
        quality_targets (bool): Whether classification targets are
            ``(labels, quality scores)`` pairs (QualityFocalLoss).
            Defaults to False.
        one_hot_targets (bool): Whether classification targets are
            one-hot (or soft) scores (N, C) (VarifocalLoss, GHMC).
            Defaults to False.
        blank (int): The blank class of a CTC loss. Defaults to 0.
    """

    num_classes: int = 4
    angle_version: str = 'le90'
    ignore_index: int = 255
    use_sigmoid: bool = True
    takes_probabilities: bool = False
    quality_targets: bool = False
    one_hot_targets: bool = False
    blank: int = 0


@dataclass
class LossCase:
    """An input of the battery.

    Args:
        name (str): Short description, e.g. ``'zero-width target box'``.
        group (str): One of :data:`GROUPS`.
        make (Callable): Returns fresh ``(args, kwargs)`` for the loss;
            the float tensors of ``args`` that require grad are the
            predictions whose gradient is checked.
        precision (torch.dtype, optional): Run with the predictions in this
            dtype under CPU autocast. Defaults to None (fp32, no autocast).
        loss_weight (float, optional): Run on a copy of the module with
            this ``loss_weight``. Defaults to None.
        refusal_ok (bool): Whether an exception raised by the loss passes
            (an invalid input refused loudly, not turned into a silent
            NaN). Defaults to False.
    """

    name: str
    group: str
    make: Callable[[], Inputs]
    precision: Optional[torch.dtype] = None
    loss_weight: Optional[float] = None
    refusal_ok: bool = False


def constant_inputs(*args: Any, **kwargs: Any) -> Callable[[], Inputs]:
    """A ``make`` that returns copies of ``args`` and ``kwargs``.

    Float tensors of ``args`` are predictions (fresh leaves that require
    grad); other tensors (targets, labels) and values are copied as they
    are, and so are ``kwargs``.

    Args:
        *args: Positional inputs of the loss.
        **kwargs: Keyword inputs (``avg_factor``, ``weight``, ...).

    Returns:
        Callable: The ``make`` of a :class:`LossCase`.
    """

    def make() -> Inputs:
        out = []
        for i, arg in enumerate(args):
            if isinstance(arg, Tensor):
                arg = arg.detach().clone()
                if i == 0 and arg.is_floating_point():
                    arg.requires_grad_(True)
            out.append(arg)
        return out, dict(kwargs)

    return make


def seeded_randn(*shape: int, seed: int = 0) -> Tensor:
    """Reproducible standard normal values."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
