# Copyright (c) mmnanguard contributors. All rights reserved.
"""Cheap finiteness checks over parameters, gradients and nested states."""

import math
from typing import Any, Dict, Iterable, List

import torch
from torch import Tensor

try:  # torch >= 2.6: foreach norms grouped by device and dtype
    from torch.nn.utils import get_total_norm as _get_total_norm
except ImportError:  # pragma: no cover - older torch
    _get_total_norm = None


def total_norm(tensors: Iterable[Tensor]) -> Tensor:
    """The global L2 norm of ``tensors`` in one fused pass.

    It is the norm ``clip_grad_norm_`` computes, and it is non-finite
    exactly when some element is (or when the finite total exceeds the
    float32 range, which is an explosion too).

    Args:
        tensors (Iterable[Tensor]): Gradients or parameters.

    Returns:
        Tensor: A 0-dim tensor; 0 for an empty input.
    """
    tensors = [t for t in tensors if t is not None]
    if not tensors:
        return torch.zeros(())
    if _get_total_norm is not None:
        return _get_total_norm(tensors, 2.0)
    norms = torch._foreach_norm(tensors, 2.0)  # pragma: no cover
    device = norms[0].device  # pragma: no cover
    return torch.linalg.vector_norm(  # pragma: no cover
        torch.stack([n.to(device) for n in norms]), 2.0
    )


def optimizer_params(optimizer: torch.optim.Optimizer) -> List[Tensor]:
    """The parameters an optimizer updates, in param-group order."""
    return [p for group in optimizer.param_groups for p in group['params']]


def grads_of(optimizer: torch.optim.Optimizer) -> List[Tensor]:
    """The existing gradients of an optimizer's parameters."""
    return [p.grad for p in optimizer_params(optimizer) if p.grad is not None]


def nonfinite_paths(tree: Any, prefix: str = '') -> List[str]:
    """Paths of the floating tensors in ``tree`` that hold non-finite values.

    Args:
        tree: A tensor, or dicts / lists / tuples of them (a checkpoint, a
            state dict, an optimizer state).
        prefix (str): Path of ``tree`` itself.

    Returns:
        list[str]: Dotted paths such as ``'state_dict.neck.conv.weight'``.
    """
    if isinstance(tree, Tensor):
        bad = tree.is_floating_point() and not bool(torch.isfinite(tree).all())
        return [prefix] if bad else []
    if isinstance(tree, dict):
        items: Iterable = tree.items()
    elif isinstance(tree, (list, tuple)):
        items = enumerate(tree)
    else:
        return []
    found: List[str] = []
    for key, value in items:
        found += nonfinite_paths(
            value, f'{prefix}.{key}' if prefix else str(key)
        )
    return found


def top_grad_norms(
    named_params: Dict[int, str], optimizer: torch.optim.Optimizer, k: int
) -> List[Dict[str, Any]]:
    """The ``k`` parameters with non-finite or largest gradient norms.

    Args:
        named_params (dict): ``id(param) -> name``.
        optimizer (Optimizer): Whose parameters to rank.
        k (int): How many to return.

    Returns:
        list[dict]: ``name`` and ``grad_norm`` (a float, or the string
        ``'nan'``/``'inf'``), non-finite first, then by decreasing norm.
    """
    params = [p for p in optimizer_params(optimizer) if p.grad is not None]
    if not params:
        return []
    norms = [float(n) for n in torch._foreach_norm([p.grad for p in params])]
    order = sorted(
        range(len(params)),
        key=lambda i: (
            math.isfinite(norms[i]),
            -norms[i] if math.isfinite(norms[i]) else 0.0,
        ),
    )
    return [
        dict(
            name=named_params.get(id(params[i]), f'param[{i}]'),
            grad_norm=json_number(norms[i]),
        )
        for i in order[:k]
    ]


def json_number(value: float) -> Any:
    """A float for JSON: non-finite values become ``'nan'``/``'inf'``."""
    value = float(value)
    return value if math.isfinite(value) else str(value)
