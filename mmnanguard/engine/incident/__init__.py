# Copyright (c) mmnanguard contributors. All rights reserved.
"""Incidents: their kinds, their report and their folder on disk.

This package sits at the bottom of mmnanguard's import graph: it imports
nothing from :mod:`mmnanguard.engine.guard`, ``.diagnosis``, ``.hooks`` or
``.optimizers``; they import from it.
"""

from .folder import (
    IncidentRecorder,
    NotAnIncidentError,
    UnsafeIncidentFolderError,
    UntrustedIncidentError,
    load_batch,
    load_incident,
    load_model_state,
    load_report,
    mark_discarded,
    replay_refusal,
    write_incident_file,
    write_report_json,
)
from .kinds import IncidentKind
from .report import IncidentReport, describe, json_number

__all__ = [
    'IncidentKind',
    'IncidentRecorder',
    'IncidentReport',
    'NotAnIncidentError',
    'UnsafeIncidentFolderError',
    'UntrustedIncidentError',
    'describe',
    'json_number',
    'load_batch',
    'load_incident',
    'load_model_state',
    'load_report',
    'mark_discarded',
    'replay_refusal',
    'write_incident_file',
    'write_report_json',
]
