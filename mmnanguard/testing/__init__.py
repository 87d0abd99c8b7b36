# Copyright (c) mmnanguard contributors. All rights reserved.
"""Helpers for tests and benchmarks: tiny real configs on generated data."""

from .tiny_configs import (
    TINY_COCO_CONFIG,
    TINY_DOTA_CONFIG,
    load_tiny_config,
    tensors_all_finite,
)

__all__ = [
    'TINY_DOTA_CONFIG',
    'TINY_COCO_CONFIG',
    'load_tiny_config',
    'tensors_all_finite',
]
