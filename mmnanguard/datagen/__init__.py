# Copyright (c) mmnanguard contributors. All rights reserved.
"""Generators of tiny datasets for tests, benchmarks and the demo."""

from .cityscapes import CITYSCAPES_NUM_CLASSES, generate_cityscapes
from .coco import COCO_TINY_CLASSES, generate_coco
from .dota import (
    BROKEN_KINDS,
    DOTA_CLASSES,
    UNKNOWN_CLASS,
    broken_line,
    format_dota_line,
    generate_dota,
)

__all__ = [
    'DOTA_CLASSES',
    'generate_dota',
    'format_dota_line',
    'COCO_TINY_CLASSES',
    'generate_coco',
    'BROKEN_KINDS',
    'UNKNOWN_CLASS',
    'broken_line',
    'CITYSCAPES_NUM_CLASSES',
    'generate_cityscapes',
]
