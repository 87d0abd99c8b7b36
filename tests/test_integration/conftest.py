# Copyright (c) mmnanguard contributors. All rights reserved.
"""Fixtures of the end-to-end tests: generated data with planted problems."""

import pytest

from mmnanguard.datagen import generate_dota


@pytest.fixture(scope='session')
def broken_dota(tmp_path_factory):
    """4 DOTA images (2 iterations an epoch at batch 2, so the broken one
    is in every epoch); ``P0000`` holds a zero-width box (line 2)."""
    root = str(tmp_path_factory.mktemp('broken_dota'))
    written = generate_dota(root, num_images=4, seed=0, broken=['zero_width'])
    return dict(root=root, **written['broken'][0])
