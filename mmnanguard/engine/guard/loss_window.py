# Copyright (c) mmnanguard contributors. All rights reserved.
"""The losses one optimizer wrapper ran backward on since its last step,
kept as device tensors until the step's read."""

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from .dtensor import global_value


def read_dtype(device: torch.device) -> torch.dtype:
    """The dtype of the read's vector on ``device`` (MPS has no float64)."""
    return torch.float32 if device.type == 'mps' else torch.float64


def as_read_scalar(value: Tensor, device: torch.device) -> Tensor:
    """``value`` as a detached 0-dim tensor of the read's dtype on
    ``device``."""
    return value.detach().reshape(()).to(device, read_dtype(device))


@dataclass
class LossWindow:
    """The losses one optimizer wrapper saw since its last step.

    Args:
        bad (Tensor): Whether any loss of the window was non-finite
            (0-dim bool).
        first_bad (Tensor): The iteration of the first non-finite one, -1
            when none (0-dim float).
        last (Tensor): The newest loss (for the spike detector).
    """

    bad: Tensor
    first_bad: Tensor
    last: Tensor

    @classmethod
    def extended(
        cls, window: Optional['LossWindow'], loss: Tensor, iteration: int
    ) -> 'LossWindow':
        """``window`` (None: a new window) with the loss of ``iteration``
        added; device operations only."""
        loss = global_value(loss.detach())
        bad = ~torch.isfinite(loss).all()
        if window is None:
            first = torch.full(
                (), -1.0, device=loss.device, dtype=read_dtype(loss.device)
            )
            return cls(bad, torch.where(bad, float(iteration), first), loss)
        new = bad & ~window.bad
        return cls(
            window.bad | bad,
            torch.where(new, float(iteration), window.first_bad),
            loss,
        )
