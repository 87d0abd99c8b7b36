# Copyright (c) mmnanguard contributors. All rights reserved.
"""Fixtures of the diagnosis tests."""

import pytest

from mmnanguard.datagen import generate_dota


@pytest.fixture(scope='session')
def zero_width_dota(tmp_path_factory):
    """4 DOTA images; ``P0000.txt`` line 2 is a rotated box of width 0."""
    root = str(tmp_path_factory.mktemp('zero_width_dota'))
    written = generate_dota(root, num_images=4, seed=0, broken=['zero_width'])
    return root, written['broken'][0]
