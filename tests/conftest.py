# Copyright (c) mmnanguard contributors. All rights reserved.
"""Shared fixtures: generated tiny datasets (once per session)."""

import pytest

import mmnanguard  # noqa: F401  (applies the stack mends first)
from mmnanguard.datagen import generate_coco, generate_dota


@pytest.fixture(scope='session')
def tiny_dota_root(tmp_path_factory):
    """A generated 8-image DOTA-format folder (``trainval/``)."""
    root = tmp_path_factory.mktemp('tiny_dota')
    generate_dota(str(root), num_images=8, seed=0)
    return str(root)


@pytest.fixture(scope='session')
def tiny_coco_root(tmp_path_factory):
    """A generated 8-image COCO-format folder with 3 classes."""
    root = tmp_path_factory.mktemp('tiny_coco')
    generate_coco(str(root), num_images=8, seed=0)
    return str(root)


@pytest.fixture(scope='session')
def tiny_cityscapes_root(tmp_path_factory):
    """A generated 4-image Cityscapes-format folder (``train``, 256x128,
    train ids 0..18 and 255 regions, no stray values)."""
    from mmnanguard.datagen import generate_cityscapes

    root = tmp_path_factory.mktemp('tiny_cityscapes')
    generate_cityscapes(str(root), num_images=4, seed=0)
    return str(root)
