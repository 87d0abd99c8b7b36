# Copyright (c) mmnanguard contributors. All rights reserved.
"""What a diagnosis found, as one value that the caller adds to the
report (the diagnosis itself never edits a report)."""

from dataclasses import dataclass
from typing import Any, Dict, Optional

from ..incident import Cause, ReportData, Stage


@dataclass(frozen=True)
class Diagnosis:
    """The outcome of :func:`~.diagnose.diagnose`: the report fields it
    fills.

    Args:
        cause (Cause): Why the incident happened.
        stage (Stage): Where the first non-finite value appeared (the live
            stage, refined by the replay).
        reproduced (bool, optional): Whether the replay of the batch went
            non-finite again.
        evidence (dict): The replay's and the checks' findings.
        diagnosis (dict): ``summary``, ``fp16_overflow``,
            ``replay_state``, ``remedy`` and ``verdict`` (the lines that
            the log and ``report.md`` show).
    """

    cause: Cause
    stage: Optional[Stage]
    reproduced: Optional[bool]
    evidence: Dict[str, Any]
    diagnosis: Dict[str, Any]

    def fields(self) -> Dict[str, Any]:
        """The report fields, by name."""
        return dict(
            cause=self.cause,
            stage=self.stage,
            reproduced=self.reproduced,
            evidence=self.evidence,
            diagnosis=self.diagnosis,
        )

    def apply_to(self, report: ReportData) -> None:
        """Set these fields of ``report`` (a live report or a dict read
        from ``report.json``)."""
        for name, value in self.fields().items():
            report[name] = value
