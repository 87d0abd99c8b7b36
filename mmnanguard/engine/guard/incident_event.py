# Copyright (c) mmnanguard contributors. All rights reserved.
"""The event the guard emits for every incident it records."""

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional, Tuple

from ..incident import IncidentReport
from .snapshot import TrainingSnapshot


@dataclass
class IncidentEvent:
    """One incident, as its listeners (the diagnosis) receive it.

    It is emitted after the incident folder is written and before the
    guard's policy acts, so the live weights are still those of the
    incident (see :mod:`mmnanguard.engine.diagnosis.replay_state`).

    Args:
        report (IncidentReport): The report (listeners may add the
            diagnosis fields and rewrite ``report.json``).
        folder (str, optional): The incident folder; None when it was not
            written (``max_incidents``, or a failed write).
        data_batch: The batch of the bad iteration, as the dataloader gave
            it (None when it is no longer held).
        rng_state (dict, optional): The RNG states at the start of that
            iteration (``save_batch=True``).
        snapshots (tuple[TrainingSnapshot]): The guard's confirmed
            snapshots, oldest first (the replay's known-good states).
    """

    report: IncidentReport
    folder: Optional[str]
    data_batch: Any = None
    rng_state: Optional[Dict[str, Any]] = None
    snapshots: Tuple[TrainingSnapshot, ...] = field(default_factory=tuple)

    @property
    def batch(self) -> Dict[str, Any]:
        """``data_batch`` and ``rng_state``, as ``batch.pth`` holds them."""
        return dict(data_batch=self.data_batch, rng_state=self.rng_state)


#: Called as ``listener(runner, event)`` for every incident.
Listener = Callable[[Any, IncidentEvent], None]


@dataclass
class IterationTrace:
    """What the hook keeps of one iteration for a report and a replay:
    references, no copies.

    Args:
        data_batch: The batch as the dataloader gave it.
        rng_state (dict, optional): The RNG states at its start.
    """

    data_batch: Any = None
    rng_state: Optional[Dict[str, Any]] = None
