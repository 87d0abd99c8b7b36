# Copyright (c) mmnanguard contributors. All rights reserved.
from . import checks, dota_annfile
from .scan import DatasetScan, format_report
from .transforms import (
    InvalidAnnotationError,
    ValidateAnnotations,
    check_results,
)

__all__ = [
    'checks',
    'dota_annfile',
    'DatasetScan',
    'format_report',
    'ValidateAnnotations',
    'InvalidAnnotationError',
    'check_results',
]
