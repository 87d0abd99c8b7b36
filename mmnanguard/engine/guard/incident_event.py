# Copyright (c) mmnanguard contributors. All rights reserved.
"""The event the guard emits for every incident it records."""

import os.path as osp
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..incident import REPORT_NAME, IncidentReport
from .snapshot import TrainingSnapshot


@dataclass
class IncidentEvent:
    """One incident, as its listeners (the diagnosis) receive it.

    It is emitted while the incident folder is written (see
    :class:`ListenersTurn`) and before the guard's policy acts, so the live
    weights are still those of the incident (see
    :mod:`mmnanguard.engine.diagnosis.replay_state`).

    Args:
        report (IncidentReport): The report; listeners add the diagnosis
            fields, and ``report.json`` is written once they all returned.
        folder (str, optional): The incident folder (its final path, for
            names in logs and reports); None when it is not written
            (``max_incidents``, or a failed write).
        files_folder (str, optional): Where listeners write their files
            now: the folder under its temporary name, renamed to
            ``folder`` after the last listener (the same as ``folder``
            once renamed).
        data_batch: The batch of the bad iteration, as the dataloader gave
            it (None when it is no longer held).
        rng_state (dict, optional): The RNG states at the start of that
            iteration (``save_batch=True``).
        snapshots (tuple[TrainingSnapshot]): The guard's confirmed
            snapshots, oldest first (the replay's known-good states).
    """

    report: IncidentReport
    folder: Optional[str]
    files_folder: Optional[str] = None
    data_batch: Any = None
    rng_state: Optional[Dict[str, Any]] = None
    snapshots: Tuple[TrainingSnapshot, ...] = field(default_factory=tuple)

    @property
    def batch(self) -> Dict[str, Any]:
        """``data_batch`` and ``rng_state``, as ``batch.pth`` holds them."""
        return dict(data_batch=self.data_batch, rng_state=self.rng_state)


#: Called as ``listener(runner, event)`` for every incident.
Listener = Callable[[Any, IncidentEvent], None]


class ListenersTurn:
    """The listeners' turn in one incident: the recorder's ``fill``
    (:meth:`IncidentRecorder.record
    <mmnanguard.engine.incident.recorder.IncidentRecorder.record>`).

    Called inside the folder being written, after ``batch.pth``: every
    listener runs on the event, and the report as they leave it is what
    ``report.json`` holds, written once. :meth:`finish` gives the event the
    written folder, and calls the listeners then when nothing was written
    (they hear of every incident).

    Args:
        runner (Runner): The runner.
        event (IncidentEvent): The incident.
        listeners (list[Callable]): Called as ``listener(runner, event)``.
    """

    def __init__(
        self, runner: Any, event: IncidentEvent, listeners: List[Listener]
    ) -> None:
        self.runner = runner
        self.event = event
        self.listeners = listeners
        self.taken = False

    def __call__(self, files_folder: str, folder: str) -> Dict[str, Any]:
        event = self.event
        event.folder, event.files_folder = folder, files_folder
        event.report.report_path = osp.join(folder, REPORT_NAME)
        self.taken = True
        self._notify()
        return event.report.to_dict()

    def finish(self, folder: Optional[str]) -> None:
        """The recorder returned ``folder`` (None: nothing written)."""
        self.event.folder = self.event.files_folder = folder
        if not self.taken:
            self._notify()

    def _notify(self) -> None:
        for listener in self.listeners:
            listener(self.runner, self.event)


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
