# Copyright (c) mmnanguard contributors. All rights reserved.
"""The config doctor: settings linked to NaNs, each with a severity and a
one-line fix in config syntax, found before anything heavy is built."""

from .context import DoctorContext
from .finding import SEVERITIES, Finding
from .runner import RULES, doctor_summary, format_findings, run_doctor

__all__ = [
    'RULES',
    'SEVERITIES',
    'DoctorContext',
    'Finding',
    'doctor_summary',
    'format_findings',
    'run_doctor',
]
