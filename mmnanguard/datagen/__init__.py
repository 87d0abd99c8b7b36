# Copyright (c) mmnanguard contributors. All rights reserved.
"""Generators of tiny datasets for tests, benchmarks and the demo."""

from .cityscapes import CITYSCAPES_NUM_CLASSES, generate_cityscapes
from .coco import COCO_TINY_CLASSES, generate_coco
from .coco_keypoints import COCO_KEYPOINT_NAMES, generate_coco_keypoints
from .dota import (
    BROKEN_KINDS,
    DOTA_CLASSES,
    UNKNOWN_CLASS,
    broken_line,
    format_dota_line,
    generate_dota,
)
from .image_folder import IMAGE_FOLDER_CLASSES, generate_image_folder

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
    'COCO_KEYPOINT_NAMES',
    'generate_coco_keypoints',
    'IMAGE_FOLDER_CLASSES',
    'generate_image_folder',
]
