# Copyright (c) mmnanguard contributors. All rights reserved.
"""Find the tensors, and the first non-finite one, in a nested output.

Module outputs of mmdet/mmrotate/mmseg models are tensors, tuples, lists,
dicts, ``InstanceData``/``DetDataSample`` (any ``BaseDataElement``) and
``BaseBoxes``; this module walks all of them.
"""

from typing import Any, Dict, Iterator, Optional, Tuple

import torch
from torch import Tensor


def iter_tensors(obj: Any, path: str = '') -> Iterator[Tuple[str, Tensor]]:
    """Yield ``(path, tensor)`` for every tensor nested in ``obj``.

    Args:
        obj: A tensor, a tuple/list/dict of them, a ``BaseDataElement``
            (``InstanceData``, ``DetDataSample``, ...) or ``BaseBoxes``.
        path (str): The path of ``obj`` itself.

    Yields:
        tuple: ``(path, tensor)``, e.g. ``('[0][2]', t)`` or
        ``('.gt_instances.bboxes', t)``.
    """
    if isinstance(obj, Tensor):
        yield path, obj
        return
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from iter_tensors(value, f'{path}[{key!r}]')
        return
    if isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from iter_tensors(value, f'{path}[{i}]')
        return
    boxes = getattr(obj, 'tensor', None)  # mmdet BaseBoxes
    if isinstance(boxes, Tensor):
        yield f'{path}.tensor', boxes
        return
    items = getattr(obj, 'items', None)  # BaseDataElement data fields
    if callable(items) and hasattr(obj, 'metainfo_keys'):
        for key, value in items():
            yield from iter_tensors(value, f'{path}.{key}')


def nonfinite_summary(tensor: Optional[Tensor]) -> Optional[Dict[str, Any]]:
    """Counts of NaN, +inf and -inf in a floating tensor, or None when it
    is finite (or not floating, or None: a gradient not computed).

    Args:
        tensor (Tensor, optional): Any tensor.

    Returns:
        dict | None: ``shape``, ``dtype``, ``nan``, ``posinf``, ``neginf``,
        ``numel``.
    """
    if tensor is None or not (
        tensor.is_floating_point() or tensor.is_complex()
    ):
        return None
    data = tensor.detach()
    if bool(torch.isfinite(data).all()):
        return None
    return dict(
        shape=list(data.shape),
        dtype=str(data.dtype).replace('torch.', ''),
        numel=data.numel(),
        nan=int(torch.isnan(data).sum()),
        posinf=int(torch.isposinf(data).sum()),
        neginf=int(torch.isneginf(data).sum()),
    )


def first_nonfinite(obj: Any) -> Optional[Dict[str, Any]]:
    """The first non-finite floating tensor nested in ``obj``.

    Args:
        obj: See :func:`iter_tensors`.

    Returns:
        dict | None: :func:`nonfinite_summary` plus ``path``; None when
        every floating tensor is finite.
    """
    for path, tensor in iter_tensors(obj):
        summary = nonfinite_summary(tensor)
        if summary is not None:
            return dict(path=path or '(output)', **summary)
    return None


def describe_values(summary: Dict[str, Any]) -> str:
    """``'3 NaN, 1 +inf of 4096 values (float32, shape [2, 64, 32, 32])'``."""
    parts = [
        f'{summary[k]} {label}'
        for k, label in (
            ('nan', 'NaN'),
            ('posinf', '+inf'),
            ('neginf', '-inf'),
        )
        if summary.get(k)
    ]
    return (
        f"{', '.join(parts) or 'non-finite'} of {summary['numel']} "
        f"values ({summary['dtype']}, shape {summary['shape']})"
    )
