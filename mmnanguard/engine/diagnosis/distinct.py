# Copyright (c) mmnanguard contributors. All rights reserved.
"""Which incidents are distinct, and which earlier diagnosis a repeat
repeats.

Two incidents are the same when their batch holds the same samples, their
kind is the same and the live iteration saw them at the same stage: a
rotated box of width 0 that comes back each epoch is one problem, while a
second broken file is another and is diagnosed on its own.
"""

import os.path as osp
from typing import Any, Dict, List, Optional, Tuple

from ..incident import ReportData
from ..incident.batch_layout import sample_name

Signature = Tuple[str, Optional[str], Tuple[str, ...]]


def incident_signature(report: ReportData) -> Signature:
    """``(kind, live stage, sorted sample files)`` of an incident."""
    files = sorted(sample_name(s) for s in report.get('samples', []))
    stage = (report.get('live') or {}).get('stage') or report.get('stage')
    return report['kind'], stage, tuple(files)


class DiagnosisLog:
    """The incidents diagnosed so far, by signature.

    Args:
        max_diagnoses (int): Distinct incidents diagnosed at most.
    """

    def __init__(self, max_diagnoses: int) -> None:
        self.max_diagnoses = max_diagnoses
        self.diagnosed: List[Dict[str, Any]] = []
        self._by_signature: Dict[Signature, Dict[str, Any]] = {}

    def repeat_of(self, report: ReportData) -> Optional[Dict[str, Any]]:
        """The earlier diagnosis ``report`` repeats, or None."""
        return self._by_signature.get(incident_signature(report))

    @property
    def full(self) -> bool:
        """Whether ``max_diagnoses`` distinct incidents were diagnosed."""
        return len(self.diagnosed) >= self.max_diagnoses

    def add(self, report: ReportData, folder: str) -> None:
        """Remember a diagnosed incident (its cause, stage and folder)."""
        entry = dict(
            folder=osp.basename(folder),
            iteration=report['iteration'],
            cause=report.get('cause'),
            stage=report.get('stage'),
            summary=(report.get('diagnosis') or {}).get('summary'),
        )
        self.diagnosed.append(entry)
        self._by_signature[incident_signature(report)] = entry
