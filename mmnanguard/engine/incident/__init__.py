# Copyright (c) mmnanguard contributors. All rights reserved.
"""Incidents: their kinds, their report and their folder on disk.

This package sits at the bottom of mmnanguard's import graph: it imports
nothing from :mod:`mmnanguard.engine.guard`, ``.diagnosis``, ``.hooks``,
``.optimizers`` or ``.runner``; they import from it.

* :mod:`.names`: the file and folder names, the errors;
* :mod:`.safe_write`: writes relative to a folder descriptor, never
  through a link, complete or absent;
* :mod:`.recorder`: the folders written during training;
* :mod:`.loading` and :mod:`.allowlist`: reading a folder back as data.
"""

from .allowlist import (
    check_batch_globals,
    check_data_elements,
    incident_batch_globals,
    load_batch,
    load_model_state,
    replay_refusal,
)
from .kinds import IncidentKind
from .labels import Cause, IncidentAction, Stage
from .loading import (
    check_report,
    linked_entries,
    load_incident,
    load_report,
    refuse_links,
)
from .names import (
    BATCH_NAME,
    CONFIG_NAME,
    DISCARDED_NAME,
    INCIDENT_DIR_RE,
    MODEL_NAME,
    REPORT_NAME,
    NotAnIncidentError,
    UnsafeIncidentFolderError,
    UntrustedIncidentError,
    parse_folder_name,
)
from .recorder import IncidentRecorder, mark_discarded
from .report import IncidentReport, ReportData, describe, json_number
from .safe_write import write_incident_file, write_report_json

__all__ = [
    'BATCH_NAME',
    'CONFIG_NAME',
    'DISCARDED_NAME',
    'INCIDENT_DIR_RE',
    'MODEL_NAME',
    'REPORT_NAME',
    'Cause',
    'IncidentAction',
    'IncidentKind',
    'Stage',
    'IncidentRecorder',
    'IncidentReport',
    'NotAnIncidentError',
    'ReportData',
    'UnsafeIncidentFolderError',
    'UntrustedIncidentError',
    'check_batch_globals',
    'check_data_elements',
    'check_report',
    'describe',
    'incident_batch_globals',
    'json_number',
    'linked_entries',
    'load_batch',
    'load_incident',
    'load_model_state',
    'load_report',
    'mark_discarded',
    'parse_folder_name',
    'refuse_links',
    'replay_refusal',
    'write_incident_file',
    'write_report_json',
]
