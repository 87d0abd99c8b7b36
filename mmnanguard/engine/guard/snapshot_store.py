# Copyright (c) mmnanguard contributors. All rights reserved.
"""The last few known-good snapshots, and which one a rollback uses."""

from collections import deque
from typing import Iterator, Optional

from .snapshot import TrainingSnapshot


class SnapshotStore:
    """Keeps the newest ``maxlen`` known-good in-memory snapshots.

    A snapshot is taken after a step and is *pending* until the guard's
    next read says the parameters after that step were finite
    (:meth:`confirm`); a rollback never restores a pending one.

    A rollback restores the newest confirmed snapshot. When the incident
    comes back before a newer snapshot was confirmed, restoring it did not
    help (a state taken after a spike can be finite but already ruined),
    so the next rollback drops it and goes one snapshot further back.

    Args:
        maxlen (int): Confirmed snapshots kept (``keep_snapshots``).
    """

    def __init__(self, maxlen: int) -> None:
        self._snapshots: deque = deque(maxlen=maxlen)
        self._newest_tried = False
        #: The snapshot waiting for its parameter check.
        self.pending: Optional[TrainingSnapshot] = None

    def add(self, snapshot: TrainingSnapshot, pending: bool = False) -> None:
        """Keep ``snapshot``; with ``pending``, until :meth:`confirm`."""
        if pending:
            self.pending = snapshot
            return
        self._snapshots.append(snapshot)
        self._newest_tried = False

    def confirm(self, finite: Optional[bool]) -> Optional[TrainingSnapshot]:
        """The parameter check of the pending snapshot's state was read:
        keep it when ``finite``, else drop it. None: not checked yet.

        Returns:
            TrainingSnapshot | None: The snapshot that was dropped.
        """
        snapshot = self.pending
        if snapshot is None or finite is None:
            return None
        self.pending = None
        if finite:
            self.add(snapshot)
            return None
        return snapshot

    def for_rollback(self) -> TrainingSnapshot:
        """The snapshot the next rollback restores."""
        if self._newest_tried and len(self._snapshots) > 1:
            self._snapshots.pop()
        self._newest_tried = True
        return self._snapshots[-1]

    @property
    def newest(self) -> Optional[TrainingSnapshot]:
        """The newest confirmed snapshot, or None."""
        return self._snapshots[-1] if self._snapshots else None

    def __iter__(self) -> Iterator[TrainingSnapshot]:
        return iter(self._snapshots)

    def __getitem__(self, index: int) -> TrainingSnapshot:
        return self._snapshots[index]

    def __len__(self) -> int:
        return len(self._snapshots)
