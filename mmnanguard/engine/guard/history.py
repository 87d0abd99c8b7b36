# Copyright (c) mmnanguard contributors. All rights reserved.
"""A ring buffer of the last iterations, for incident reports."""

from collections import deque
from typing import Any, Dict, List, Optional

from .finite import json_number


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
        lr: Optional[float],
        loss_scale: Optional[float] = None,
        event: Optional[str] = None,
        lr_scheduled: Optional[float] = None,
    ) -> None:
        """Record one iteration (non-finite floats are kept as strings).

        ``lr`` is the lr of the first param group in the step, and
        ``lr_scheduled`` what the param schedulers prescribed for it
        (:class:`~.scheduled_lr.ScheduledLr`).
        """
        self._buffer.append(
            dict(
                iteration=iteration,
                loss_terms={k: json_number(v) for k, v in loss_terms.items()},
                grad_norm=None
                if grad_norm is None
                else json_number(grad_norm),
                lr=lr,
                lr_scheduled=lr_scheduled,
                loss_scale=loss_scale,
                event=event,
            )
        )

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
