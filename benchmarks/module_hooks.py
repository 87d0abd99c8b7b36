# Copyright (c) mmnanguard contributors. All rights reserved.
"""The always-on alternative to the guard: per-module finiteness hooks.

This is what users are told to do today (a forward hook and an
output-gradient hook that check every module, every iteration). A
benchmark helper, not part of the package: ``benchmarks/overhead.py
--modes module_hooks`` imports it as a sibling module and measures it as
a baseline.
"""

from typing import Any, List

import torch
from torch import nn


def _tensors(obj: Any) -> List[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensors(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _tensors(o)]
    return []


def install_finiteness_hooks(model: nn.Module) -> List[Any]:
    """Check every module's outputs and output gradients, every iteration.

    Gradients are checked with ``Tensor.register_hook`` on the outputs, not
    ``register_full_backward_hook`` (which breaks on mmdet's in-place ReLU).

    Args:
        model (nn.Module): The model.

    Returns:
        list: The hook handles (``handle.remove()`` to uninstall).
    """
    flags = dict(forward=0, backward=0)

    def check_grad(grad):
        flags['backward'] += int(not bool(torch.isfinite(grad).all()))

    def check_output(module, args, output):
        for t in _tensors(output):
            if t.is_floating_point():
                flags['forward'] += int(not bool(torch.isfinite(t).all()))
                if t.requires_grad:
                    t.register_hook(check_grad)

    return [m.register_forward_hook(check_output) for m in model.modules()]
