# Copyright (c) mmnanguard contributors. All rights reserved.
"""A battery of adversarial inputs for loss modules: value and gradient of
each case, through a real backward pass."""

from .case import GROUPS, BatteryContext, LossCase
from .dropins import SAFE_DROP_INS, SAFE_MODULES_INCLUDE, drop_in_for
from .kinds import KINDS, infer_kind
from .module_check import (
    ModuleReport,
    check_config_losses,
    check_loss_config,
    check_module,
)
from .runner import CaseResult, battery_cases, run_battery, run_case
from .table import format_table

__all__ = [
    'GROUPS',
    'KINDS',
    'SAFE_DROP_INS',
    'SAFE_MODULES_INCLUDE',
    'BatteryContext',
    'CaseResult',
    'LossCase',
    'ModuleReport',
    'battery_cases',
    'check_config_losses',
    'check_loss_config',
    'check_module',
    'drop_in_for',
    'format_table',
    'infer_kind',
    'run_battery',
    'run_case',
]
