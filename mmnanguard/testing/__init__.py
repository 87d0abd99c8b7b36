# Copyright (c) mmnanguard contributors. All rights reserved.
"""Helpers for tests and benchmarks: tiny real configs on generated data."""

from .loss_stability import assert_loss_stable
from .tiny_configs import (
    TINY_COCO_CONFIG,
    TINY_DOTA_CONFIG,
    load_tiny_config,
    tensors_all_finite,
)

__all__ = [
    'assert_loss_stable',
    'TINY_DOTA_CONFIG',
    'TINY_COCO_CONFIG',
    'load_tiny_config',
    'tensors_all_finite',
]
