# Copyright (c) mmnanguard contributors. All rights reserved.
"""Marks for tests that need an optional package of the stack (mmrotate,
mmseg): skipped, with the reason, on a supported stack that lacks it."""

import pytest

from mmnanguard.optional import is_available

needs_mmrotate = pytest.mark.skipif(
    not is_available('mmrotate'), reason='the stack has no mmrotate'
)
needs_mmseg = pytest.mark.skipif(
    not is_available('mmseg'), reason='the stack has no mmseg'
)
