# Copyright (c) mmnanguard contributors. All rights reserved.
"""Marks for tests that need an optional package of the stack (mmrotate,
mmseg, the toolboxes mmyolo, mmpretrain, mmpose, mmocr and mmaction2):
skipped, with the reason, on a supported stack that lacks it."""

import pytest

from mmnanguard.optional import is_available

needs_mmrotate = pytest.mark.skipif(
    not is_available('mmrotate'), reason='the stack has no mmrotate'
)
needs_mmseg = pytest.mark.skipif(
    not is_available('mmseg'), reason='the stack has no mmseg'
)
needs_mmyolo = pytest.mark.skipif(
    not is_available('mmyolo'), reason='the stack has no mmyolo'
)
needs_mmpretrain = pytest.mark.skipif(
    not is_available('mmpretrain'), reason='the stack has no mmpretrain'
)
needs_mmpose = pytest.mark.skipif(
    not is_available('mmpose'), reason='the stack has no mmpose'
)
needs_mmocr = pytest.mark.skipif(
    not is_available('mmocr'), reason='the stack has no mmocr'
)
needs_mmaction = pytest.mark.skipif(
    not is_available('mmaction'), reason='the stack has no mmaction2'
)
