# Copyright (c) mmnanguard contributors. All rights reserved.
"""Tell from the ring buffer whether training exploded: the gradient norm
or the loss grew by orders of magnitude, or the lr left its schedule."""

import math
from typing import Any, Dict, List, Optional, Tuple


def _number(value: Any) -> Optional[float]:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _growth(
    points: List[Tuple[int, Optional[float]]], min_points: int
) -> Optional[Dict[str, Any]]:
    """Newest finite value over the smallest finite value before it (None
    with fewer than ``min_points`` finite values or a smallest value
    <= 0)."""
    finite = [(it, v) for it, v in points if v is not None]
    if len(finite) < min_points:
        return None
    to_iter, to_value = finite[-1]
    from_iter, from_value = min(finite[:-1], key=lambda p: p[1])
    if from_value <= 0:  # no scale to grow from (a zero or negative loss)
        return None
    ratio = to_value / from_value
    return dict(
        ratio=ratio,
        orders=math.log10(ratio) if ratio > 0 else None,
        from_iter=from_iter,
        to_iter=to_iter,
        from_value=from_value,
        to_value=to_value,
    )


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
        ``from_iter``, ``to_norm``, ``to_iter``, ``lr_from``, ``lr_to``
        (None when no lr is recorded); None with fewer than ``min_points``
        finite norms.
    """
    entries = [h for h in history if h['iteration'] <= iteration]
    found = _growth(
        [(h['iteration'], _number(h.get('grad_norm'))) for h in entries],
        min_points,
    )
    if found is None:
        return None
    lrs = [lr for lr in (_number(h.get('lr')) for h in entries) if lr]
    found['from_norm'] = found.pop('from_value')
    found['to_norm'] = found.pop('to_value')
    found.update(
        lr_from=lrs[0] if lrs else None, lr_to=lrs[-1] if lrs else None
    )
    return found


def loss_growth(
    history: List[Dict[str, Any]], iteration: int, min_points: int = 3
) -> Optional[Dict[str, Any]]:
    """How much the finite total loss grew over the buffered iterations
    (the rule of :func:`grad_norm_growth`, on ``loss_terms['loss']``).

    Returns:
        dict | None: ``ratio``, ``orders``, ``from_value``, ``from_iter``,
        ``to_value``, ``to_iter``; None with fewer than ``min_points``
        finite losses.
    """
    return _growth(
        [
            (h['iteration'], _number(h.get('loss_terms', {}).get('loss')))
            for h in history
            if h['iteration'] <= iteration
        ],
        min_points,
    )


def lr_off_schedule(
    history: List[Dict[str, Any]], iteration: int
) -> Optional[Dict[str, Any]]:
    """The buffered iteration and param group whose lr was furthest above
    the schedule.

    An lr changed by the configured param schedulers (warmup, steps,
    cosine) is expected, however fast it rises; an lr above what they
    prescribe (``lr_scheduled`` in the history) was set by someone else,
    and by orders of magnitude it makes one finite update throw the
    weights out of range.

    Args:
        history (list[dict]): The report's ``history``.
        iteration (int): The incident's iteration; later entries are
            ignored.

    Returns:
        dict | None: ``ratio`` (lr over the prescribed lr), ``iteration``,
        ``group`` (the param group's index over every optimizer), ``lr``,
        ``lr_scheduled``; None when no iteration has both.
    """
    points = []
    for h in history:
        if h['iteration'] > iteration:
            continue
        for group, (lr, planned) in enumerate(_group_lrs(h)):
            if lr and planned and planned > 0:
                points.append(
                    (lr / planned, h['iteration'], group, lr, planned)
                )
    if not points:
        return None
    ratio, it, group, lr, planned = max(points)
    return dict(
        ratio=ratio, iteration=it, group=group, lr=lr, lr_scheduled=planned
    )


def _group_lrs(
    entry: Dict[str, Any],
) -> List[Tuple[Optional[float], Optional[float]]]:
    """``(live, prescribed)`` lr of every param group of a history entry
    (``lrs``/``lrs_scheduled``; an older report's single ``lr``)."""
    if entry.get('lrs') is not None:
        planned = list(entry.get('lrs_scheduled') or [])
        planned += [None] * (len(entry['lrs']) - len(planned))
        return [
            (_number(a), _number(b)) for a, b in zip(entry['lrs'], planned)
        ]
    return [(_number(entry.get('lr')), _number(entry.get('lr_scheduled')))]
