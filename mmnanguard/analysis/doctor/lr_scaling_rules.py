# Copyright (c) mmnanguard contributors. All rights reserved.
"""How an optimizer family's learning rate follows the total batch size.

* SGD (with or without momentum): the linear-scaling rule, lr x
  batch / base batch (Goyal et al., 2017; what mmengine's
  ``auto_scale_lr`` applies).
* Adam, AdamW, Adamax, NAdam, RAdam: the square-root rule, lr x
  sqrt(batch / base batch), or none (an lr kept from a larger batch, as
  users of mmdet's DETR family on fewer GPUs do); both are in use.
* Adadelta, Adagrad: none (their step adapts per parameter; ``lr`` is a
  multiplier of that).

The family is read off the built optimizer (``isinstance``), so a
registered subclass of one of these is judged by its base.
"""

import math
from enum import Enum
from typing import NamedTuple, Optional, Tuple

import torch


class ScalingRule(Enum):
    """A rule that gives the lr for a total batch from the lr for a base
    batch."""

    LINEAR = 'linear-scaling'
    SQUARE_ROOT = 'square-root'
    NONE = 'no-scaling'

    def factor(self, total: int, base: int) -> float:
        """The lr multiplier for ``total`` images where the lr was set for
        ``base``."""
        if self is ScalingRule.LINEAR:
            return total / base
        if self is ScalingRule.SQUARE_ROOT:
            return math.sqrt(total / base)
        return 1.0

    def describe(self, total: int, base: int) -> str:
        """The rule with its multiplier, e.g. ``'linear-scaling rule (x
        2/16)'``."""
        if self is ScalingRule.LINEAR:
            return f'{self.value} rule (x {total}/{base})'
        if self is ScalingRule.SQUARE_ROOT:
            return f'{self.value} rule (x sqrt({total}/{base}))'
        return 'no-scaling rule (x 1)'


class OptimizerFamily(NamedTuple):
    """An optimizer family and the scaling rules it accepts.

    Args:
        name (str): The built optimizer's class name.
        rules (tuple[ScalingRule]): The accepted rules; the first is the
            one proposed in a fix.
    """

    name: str
    rules: Tuple[ScalingRule, ...]


#: Base classes -> accepted rules, most specific first.
FAMILY_RULES = (
    ((torch.optim.SGD,), (ScalingRule.LINEAR,)),
    (
        (
            torch.optim.Adam,
            torch.optim.AdamW,
            torch.optim.Adamax,
            torch.optim.NAdam,
            torch.optim.RAdam,
        ),
        (ScalingRule.SQUARE_ROOT, ScalingRule.NONE),
    ),
    ((torch.optim.Adadelta, torch.optim.Adagrad), (ScalingRule.NONE,)),
)


def optimizer_family(
    optimizer: torch.optim.Optimizer,
) -> Optional[OptimizerFamily]:
    """The family of a built optimizer, or None when no rule is known for
    it (RMSprop, LAMB, Lion, ...).

    Args:
        optimizer (torch.optim.Optimizer): The built optimizer.

    Returns:
        OptimizerFamily | None: Its name and accepted rules.
    """
    for bases, rules in FAMILY_RULES:
        if isinstance(optimizer, bases):
            return OptimizerFamily(type(optimizer).__name__, rules)
    return None
