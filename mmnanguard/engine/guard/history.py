# Copyright (c) mmnanguard contributors. All rights reserved.
"""A ring buffer of the last iterations, for incident reports."""

import math
from collections import deque
from typing import Any, Dict, List, Optional, Sequence

from .finite import json_number


def _finite(value: Any) -> Optional[float]:
    return value if isinstance(value, float) and math.isfinite(value) else None


def deciding_group(
    lrs: Sequence[Any], planned: Sequence[Optional[float]]
) -> Optional[int]:
    """The param group furthest above its prescribed lr (the ratio of live
    to prescribed, when one is above), else the one with the largest
    finite lr; None without a finite lr. A non-finite lr decides."""
    if any(isinstance(v, str) for v in lrs):  # 'nan', 'inf'
        return next(i for i, v in enumerate(lrs) if isinstance(v, str))
    ratios = [
        (lr / p, i)
        for i, (lr, p) in enumerate(zip(lrs, planned))
        if _finite(lr) is not None and p and _finite(float(p)) and p > 0
    ]
    if ratios and max(ratios)[0] > 1.0:
        return max(ratios)[1]
    finite = [(lr, i) for i, lr in enumerate(lrs) if _finite(lr) is not None]
    return max(finite)[1] if finite else None


class IterationHistory:
    """Loss terms, grad norm, learning rate (as used and as the param
    schedulers prescribe it) and loss scale per iteration.

    Args:
        maxlen (int): Iterations kept.
    """

    def __init__(self, maxlen: int) -> None:
        self._buffer: deque = deque(maxlen=maxlen)

    def append(
        self,
        iteration: int,
        loss_terms: Dict[str, float],
        grad_norm: Optional[float],
        lr: Optional[float] = None,
        loss_scale: Optional[float] = None,
        event: Optional[str] = None,
        lr_scheduled: Optional[float] = None,
        lrs: Optional[Sequence[float]] = None,
        lrs_scheduled: Optional[Sequence[Optional[float]]] = None,
    ) -> None:
        """Record one iteration (non-finite floats are kept as strings).

        ``lrs`` is the live lr of every param group of every optimizer in
        the step and ``lrs_scheduled`` what the param schedulers prescribed
        for each (:class:`~.scheduled_lr.ScheduledLr`; None where
        unknown). Given ``lrs``, ``lr`` and ``lr_scheduled`` are those of
        the group furthest above its schedule (else of the largest lr): the
        one an explosion diagnosis looks at.
        """
        entry = dict(
            iteration=iteration,
            loss_terms={k: json_number(v) for k, v in loss_terms.items()},
            grad_norm=None if grad_norm is None else json_number(grad_norm),
            lr=lr,
            lr_scheduled=lr_scheduled,
            loss_scale=loss_scale,
            event=event,
        )
        if lrs is not None:
            lrs = [json_number(v) for v in lrs]
            planned = list(lrs_scheduled or [None] * len(lrs))
            entry.update(lrs=lrs, lrs_scheduled=planned)
            index = deciding_group(lrs, planned)
            if index is not None:
                entry.update(lr=lrs[index], lr_scheduled=planned[index])
        self._buffer.append(entry)

    def mark_last(self, event: str) -> None:
        """Attach an event name (``'incident'``, ``'spike'``) to the newest
        entry."""
        if self._buffer:
            self._buffer[-1]['event'] = event

    def to_list(self) -> List[Dict[str, Any]]:
        """The buffered iterations, oldest first."""
        return list(self._buffer)

    def __len__(self) -> int:
        return len(self._buffer)
