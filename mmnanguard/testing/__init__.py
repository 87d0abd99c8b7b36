# Copyright (c) mmnanguard contributors. All rights reserved.
"""Helpers for tests and benchmarks: tiny real configs on generated data,
and :class:`FaultInjectionHook` (registered only by importing this package:
``import mmnanguard`` leaves it out of the registries)."""

from .fault_injection_hook import FaultInjectionHook
from .loss_stability import assert_loss_stable
from .tiny_configs import (
    TINY_COCO_CONFIG,
    TINY_DOTA_CONFIG,
    load_tiny_config,
    tensors_all_finite,
)

__all__ = [
    'FaultInjectionHook',
    'assert_loss_stable',
    'TINY_DOTA_CONFIG',
    'TINY_COCO_CONFIG',
    'load_tiny_config',
    'tensors_all_finite',
]
