# Copyright (c) mmnanguard contributors. All rights reserved.
"""The last few known-good snapshots, and which one a rollback uses."""

from collections import deque
from typing import Iterator, Optional

from .snapshot import TrainingSnapshot


class SnapshotStore:
    """Keeps the newest ``maxlen`` in-memory snapshots.

    A rollback restores the newest one. When the incident comes back before
    a newer snapshot was taken, restoring it did not help (a state taken
    after a spike can be finite but already ruined), so the next rollback
    drops it and goes one snapshot further back.

    Args:
        maxlen (int): Snapshots kept (``keep_snapshots``).
    """

    def __init__(self, maxlen: int) -> None:
        self._snapshots: deque = deque(maxlen=maxlen)
        self._newest_tried = False

    def add(self, snapshot: TrainingSnapshot) -> None:
        """Keep ``snapshot`` as the newest known-good state."""
        self._snapshots.append(snapshot)
        self._newest_tried = False

    def for_rollback(self) -> TrainingSnapshot:
        """The snapshot the next rollback restores."""
        if self._newest_tried and len(self._snapshots) > 1:
            self._snapshots.pop()
        self._newest_tried = True
        return self._snapshots[-1]

    @property
    def newest(self) -> Optional[TrainingSnapshot]:
        """The newest snapshot, or None."""
        return self._snapshots[-1] if self._snapshots else None

    def __iter__(self) -> Iterator[TrainingSnapshot]:
        return iter(self._snapshots)

    def __getitem__(self, index: int) -> TrainingSnapshot:
        return self._snapshots[index]

    def __len__(self) -> int:
        return len(self._snapshots)
