# Copyright (c) mmnanguard contributors. All rights reserved.
"""The report of one incident: one dataclass, written as ``report.json``."""

import math
from dataclasses import dataclass, field, fields
from typing import Any, Dict, Iterator, List, Optional, Union

from .kinds import IncidentKind
from .labels import Cause, IncidentAction, Stage

#: Fields that only the diagnosis (or a repeat) fills; ``report.json``
#: holds them once they are set.
DIAGNOSIS_FIELDS = (
    'cause',
    'reproduced',
    'evidence',
    'diagnosis',
    'repeat_of',
    'diagnosis_error',
    'diagnosis_skipped',
)
#: Fields that some kinds carry and others do not.
OPTIONAL_FIELDS = DIAGNOSIS_FIELDS + (
    'spikes',
    'nonfinite_tensors',
    'restored_buffers',
    'detected_at',
    'report_path',
    'write_error',
    'discarded_by_resume',
    'resumed_at_iteration',
)


def json_number(value: Any) -> Any:
    """A float for JSON: non-finite values become ``'nan'``/``'inf'``."""
    value = float(value)
    return value if math.isfinite(value) else str(value)


@dataclass
class IncidentReport:
    """What ``NanGuardHook`` knows about one incident.

    The guard fills the first fields when the incident happens; the
    diagnosis (:class:`~mmnanguard.engine.hooks.NanDiagnosisHook`) adds
    ``cause``, ``stage``, ``reproduced``, ``evidence`` and ``diagnosis``.
    :meth:`to_dict` gives the ``report.json`` content. Item access
    (``report['kind']``, ``report.get('stage')``) reads and writes the
    fields by name, so the diagnosis works on a report read back from
    disk (a dict) and on a live one alike; a name that is not a field
    raises ``KeyError``, so nobody adds an undeclared key.

    Args:
        iteration (int): The iteration whose update was bad (for a
            parameter check, the step that made the weights non-finite).
        epoch (int): The runner's epoch.
        kind (IncidentKind): What went wrong.
        action (IncidentAction): ``raise``, ``skip`` or ``rollback``.
        reason (str): Why that action (policy, escalation, ...).
        rank (int): This process' rank.
        world_size (int): Number of processes.
        local_fault (bool): Whether this rank saw the value itself.
        stage (Stage, optional): Where the first non-finite value was
            seen (see :mod:`mmnanguard.engine.guard.stage`).
        live (dict, optional): The live evidence behind ``stage``.
        loss_terms (dict): Loss terms of the iteration (non-finite as
            strings).
        nonfinite_terms (dict): The non-finite ones.
        grad_norm (float | str, optional): The global gradient norm.
        lr (dict): The live lr of every param group, per optimizer.
        loss_scale (float, optional): The AMP loss scale.
        samples (list[dict]): ``img_path``, ``img_id``, ``seg_map_path``
            of every sample of the batch.
        top_grad_params (list[dict]): Parameters with non-finite or the
            largest gradient norms, measured before ``clip_grad``.
        history (list[dict]): The ring buffer of recent iterations.
        work_dir (str): The runner's work dir.
    """

    iteration: int
    epoch: int
    kind: IncidentKind
    action: IncidentAction
    reason: str
    rank: int = 0
    world_size: int = 1
    local_fault: bool = True
    stage: Optional[Stage] = None
    live: Optional[Dict[str, Any]] = None
    loss_terms: Dict[str, Any] = field(default_factory=dict)
    nonfinite_terms: Dict[str, str] = field(default_factory=dict)
    grad_norm: Any = None
    lr: Dict[str, List[float]] = field(default_factory=dict)
    loss_scale: Optional[float] = None
    samples: List[Dict[str, Any]] = field(default_factory=list)
    top_grad_params: List[Dict[str, Any]] = field(default_factory=list)
    history: List[Dict[str, Any]] = field(default_factory=list)
    work_dir: Optional[str] = None
    #: The training dataset's annotation file (a COCO json names each bad
    #: box's annotation id), when it is one file.
    ann_file: Optional[str] = None
    #: The iteration in which the guard saw it, when later than
    #: ``iteration`` (a parameter check is read with the next step).
    detected_at: Optional[int] = None
    #: Spike incidents: the quantities that spiked.
    spikes: Optional[List[Dict[str, Any]]] = None
    #: Poisoned checkpoints: the paths of the non-finite tensors.
    nonfinite_tensors: Optional[List[str]] = None
    #: The buffers the forward made non-finite (BatchNorm statistics),
    #: restored to their values before it.
    restored_buffers: Optional[List[str]] = None
    report_path: Optional[str] = None
    #: Why the incident folder could not be written (a full disk, ...).
    write_error: Optional[str] = None
    cause: Optional[Cause] = None
    reproduced: Optional[bool] = None
    evidence: Optional[Any] = None
    diagnosis: Optional[Dict[str, Any]] = None
    repeat_of: Optional[Dict[str, Any]] = None
    diagnosis_error: Optional[str] = None
    diagnosis_skipped: Optional[str] = None
    #: A resume discarded the part of the run this incident belongs to.
    discarded_by_resume: Optional[bool] = None
    #: The iteration that resume started at.
    resumed_at_iteration: Optional[int] = None

    def __setattr__(self, name: str, value: Any) -> None:
        label = _LABELS.get(name)
        if label is not None:  # a string from disk, or a member
            value = label.coerce(value, name)
        super().__setattr__(name, value)

    # -- mapping access, restricted to the fields ---------------------------
    def _check(self, key: str) -> None:
        if key not in _FIELD_NAMES:
            raise KeyError(
                f'nanguard: {key!r} is not a field of an incident report; '
                f'fields are {sorted(_FIELD_NAMES)}'
            )

    def __getitem__(self, key: str) -> Any:
        self._check(key)
        return getattr(self, key)

    def __setitem__(self, key: str, value: Any) -> None:
        self._check(key)
        setattr(self, key, value)

    def __contains__(self, key: object) -> bool:
        return key in _FIELD_NAMES and (
            key not in OPTIONAL_FIELDS or getattr(self, key) is not None
        )

    def get(self, key: str, default: Any = None) -> Any:
        """The field ``key``, or ``default`` when it is unset or unknown."""
        if key not in self:
            return default
        return getattr(self, key)

    def keys(self) -> Iterator[str]:
        """The names of the fields ``report.json`` holds."""
        return iter(self.to_dict())

    def to_dict(self) -> Dict[str, Any]:
        """The ``report.json`` content (unset optional fields left out)."""
        out: Dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in OPTIONAL_FIELDS and value is None:
                continue
            label = f.name in _LABELS and value is not None
            out[f.name] = value.value if label else value
        return out

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> 'IncidentReport':
        """Build from a ``report.json`` content; unknown keys are an error.

        Raises:
            KeyError: Naming the keys that are not fields.
            ValueError: For an unknown ``kind``.
        """
        unknown = sorted(set(data) - _FIELD_NAMES)
        if unknown:
            raise KeyError(
                f'nanguard: {unknown} are not fields of an incident report'
            )
        return cls(**data)


_FIELD_NAMES = frozenset(f.name for f in fields(IncidentReport))
#: The fields held as enum members, and their enums.
_LABELS: Dict[str, Any] = dict(
    kind=IncidentKind, action=IncidentAction, stage=Stage, cause=Cause
)


def describe(report: Any) -> str:
    """One paragraph for logs and exceptions."""
    terms = report.get('nonfinite_terms') or {}
    terms_txt = ', '.join(f'{k}={v}' for k, v in terms.items()) or 'none'
    path = report.get('report_path') or (
        f"(not written: {report.get('write_error') or 'max_incidents'})"
    )
    return (
        f"{report['kind']} at iteration {report['iteration']} "
        f"(epoch {report['epoch']}, rank {report['rank']}, stage "
        f"{report.get('stage')}): non-finite "
        f'loss terms: {terms_txt}; grad_norm={report.get("grad_norm")}; '
        f"action: {report['action']} ({report['reason']}); "
        f'incident report: {path}'
    )


#: A report as the diagnosis reads and completes it: live (an
#: :class:`IncidentReport`) or read back from ``report.json`` (a dict).
ReportData = Union[Dict[str, Any], IncidentReport]
