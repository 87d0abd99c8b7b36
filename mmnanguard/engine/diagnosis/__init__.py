# Copyright (c) mmnanguard contributors. All rights reserved.
"""Diagnosis of incidents: replay, data checks, classification, reports."""

from ..incident import NotAnIncidentError, load_incident
from .batch_checks import check_batch, model_classes
from .classify import CAUSES, classify
from .diagnose import diagnose, write_diagnosis, write_diagnosis_files
from .outcome import Diagnosis
from .probe import ActivationProbe
from .replay import ReplayResult, replay_batch
from .replay_state import amp_settings, replay_model
from .report_md import render_markdown, verdict_lines
from .timeline import write_timeline

__all__ = [
    'check_batch',
    'model_classes',
    'CAUSES',
    'classify',
    'Diagnosis',
    'diagnose',
    'write_diagnosis',
    'write_diagnosis_files',
    'NotAnIncidentError',
    'load_incident',
    'ActivationProbe',
    'ReplayResult',
    'replay_batch',
    'amp_settings',
    'replay_model',
    'render_markdown',
    'verdict_lines',
    'write_timeline',
]
