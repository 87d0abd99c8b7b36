# Copyright (c) mmnanguard contributors. All rights reserved.
from .amp_scale_monitor_hook import AmpScaleMonitorHook
from .nan_diagnosis_hook import NanDiagnosisHook
from .nanguard_hook import NanGuardHook

__all__ = [
    'NanGuardHook',
    'AmpScaleMonitorHook',
    'NanDiagnosisHook',
]
