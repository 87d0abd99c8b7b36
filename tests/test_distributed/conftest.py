# Copyright (c) mmnanguard contributors. All rights reserved.
"""The distributed tests reuse the end-to-end tests' helpers."""

import os.path as osp
import sys

sys.path.insert(
    0,
    osp.join(
        osp.dirname(osp.dirname(osp.abspath(__file__))), 'test_integration'
    ),
)
