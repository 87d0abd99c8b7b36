# Copyright (c) mmnanguard contributors. All rights reserved.
"""Generated data of the toolbox tests (once per session)."""

import pytest

from mmnanguard.datagen import generate_coco_keypoints, generate_image_folder


@pytest.fixture(scope='session')
def tiny_keypoints_root(tmp_path_factory):
    """A generated COCO person-keypoint set: 6 images of 96x96 pixels,
    1 or 2 stick figures each."""
    root = tmp_path_factory.mktemp('tiny_keypoints')
    generate_coco_keypoints(str(root), num_images=6, seed=0)
    return str(root)


@pytest.fixture(scope='session')
def tiny_image_folder(tmp_path_factory):
    """A generated ImageFolder set: ``train/{circle,cross,square}``, 4
    images of 48x48 pixels each."""
    root = tmp_path_factory.mktemp('tiny_image_folder')
    return generate_image_folder(str(root), seed=0)
