# Copyright (c) mmnanguard contributors. All rights reserved.
"""Tell from the ring buffer whether the gradient norm exploded."""

import math
from typing import Any, Dict, List, Optional


def _number(value: Any) -> Optional[float]:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def grad_norm_growth(
    history: List[Dict[str, Any]], iteration: int, min_points: int = 3
) -> Optional[Dict[str, Any]]:
    """How much the finite gradient norm grew over the buffered iterations.

    The growth is the newest finite norm (the incident iteration's own,
    when it is finite) over the smallest finite norm before it.

    Args:
        history (list[dict]): ``IterationHistory.to_list()`` (the report's
            ``history``).
        iteration (int): The incident's iteration; later entries are
            ignored.
        min_points (int): Finite norms needed to say anything.

    Returns:
        dict | None: ``ratio``, ``orders`` (log10 of it), ``from_norm``,
        ``from_iter``, ``to_norm``, ``to_iter``, ``lr_from``, ``lr_to``;
        None with fewer than ``min_points`` finite norms.
    """
    points = [
        (h['iteration'], _number(h.get('grad_norm')), h.get('lr'))
        for h in history
        if h['iteration'] <= iteration
    ]
    finite = [(it, g, lr) for it, g, lr in points if g is not None]
    if len(finite) < min_points:
        return None
    to_iter, to_norm, _ = finite[-1]
    from_iter, from_norm, _ = min(finite[:-1], key=lambda p: p[1])
    ratio = to_norm / from_norm if from_norm > 0 else math.inf
    lrs = [_number(lr) for _, _, lr in points if _number(lr) is not None]
    return dict(
        ratio=ratio,
        orders=math.log10(ratio) if 0 < ratio < math.inf else None,
        from_norm=from_norm,
        from_iter=from_iter,
        to_norm=to_norm,
        to_iter=to_iter,
        lr_from=lrs[0] if lrs else None,
        lr_to=lrs[-1] if lrs else None,
    )


def lr_jump(
    history: List[Dict[str, Any]], iteration: int
) -> Optional[Dict[str, Any]]:
    """How much the learning rate rose over the buffered iterations.

    An lr that jumps by orders of magnitude makes one finite update throw
    the weights out of range: the *update* explodes while the gradient norm
    still looks normal.

    Args:
        history (list[dict]): The report's ``history``.
        iteration (int): The incident's iteration; later entries are
            ignored.

    Returns:
        dict | None: ``ratio`` (newest lr over the smallest lr before it),
        ``from_lr``, ``from_iter``, ``to_lr``, ``to_iter``; None with fewer
        than 2 finite positive lrs.
    """
    points = [
        (h['iteration'], _number(h.get('lr')))
        for h in history
        if h['iteration'] <= iteration
    ]
    finite = [(it, lr) for it, lr in points if lr is not None and lr > 0]
    if len(finite) < 2:
        return None
    to_iter, to_lr = finite[-1]
    from_iter, from_lr = min(finite[:-1], key=lambda p: p[1])
    return dict(
        ratio=to_lr / from_lr,
        from_lr=from_lr,
        from_iter=from_iter,
        to_lr=to_lr,
        to_iter=to_iter,
    )
