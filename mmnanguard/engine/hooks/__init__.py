# Copyright (c) mmnanguard contributors. All rights reserved.
from .amp_scale_monitor_hook import AmpScaleMonitorHook
from .fault_injection_hook import FaultInjectionHook
from .nan_diagnosis_hook import NanDiagnosisHook
from .nanguard_hook import NanGuardHook

__all__ = [
    'NanGuardHook',
    'FaultInjectionHook',
    'AmpScaleMonitorHook',
    'NanDiagnosisHook',
]
