# Copyright (c) mmnanguard contributors. All rights reserved.
"""The label check, applied to the built cross-entropy modules of a model.

Every upstream ``CrossEntropyLoss`` module (mmdet's or mmseg's) that takes
class labels is wrapped, in place, by a :class:`CheckedCrossEntropyLoss`
holding the very same module, so the loss computed is unchanged. Left
alone: ``use_mask=True`` losses (mask heads: their targets are masks and
mmdet's ``mask_cross_entropy`` refuses an ``ignore_index``), and, at each
call, targets that are not integer class indices (binary BCE targets of
the score's shape, such as centerness or objectness).
"""

import sys
from typing import Dict, List

import torch.nn as nn

from mmnanguard.models.losses import CheckedCrossEntropyLoss

#: Module holding each upstream CrossEntropyLoss -> its ``impl``.
_UPSTREAM = {
    'mmdet.models.losses.cross_entropy_loss': 'mmdet',
    'mmseg.models.losses.cross_entropy_loss': 'mmseg',
}


def upstream_cross_entropy_types() -> Dict[type, str]:
    """The upstream ``CrossEntropyLoss`` classes imported so far, with the
    ``impl`` of :class:`CheckedCrossEntropyLoss` that matches each (a
    model built with one has imported its module)."""
    found = {}
    for module_name, impl in _UPSTREAM.items():
        cls = getattr(sys.modules.get(module_name), 'CrossEntropyLoss', None)
        if cls is not None:
            found[cls] = impl
    return found


def wrap_cross_entropy(model: nn.Module) -> List[str]:
    """Wrap every class-label ``CrossEntropyLoss`` of ``model`` in place.

    Args:
        model (nn.Module): The built model (not wrapped by DDP).

    Returns:
        list[str]: The names of the wrapped modules.
    """
    types = upstream_cross_entropy_types()
    wrapped: List[str] = []
    if not types:
        return wrapped

    def visit(parent: nn.Module, prefix: str) -> None:
        for name, child in list(parent.named_children()):
            path = f'{prefix}.{name}' if prefix else name
            if isinstance(child, CheckedCrossEntropyLoss):
                continue
            impl = types.get(type(child))
            if impl is not None and not getattr(child, 'use_mask', False):
                parent._modules[name] = CheckedCrossEntropyLoss.wrapping(
                    child, impl
                )
                wrapped.append(path)
                continue
            visit(child, path)

    visit(model, '')
    return wrapped
