# Copyright (c) mmnanguard contributors. All rights reserved.
"""Make ``custom_losses`` (the broken losses of the tests) importable and
registered."""

import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))

import custom_losses  # noqa: E402,F401
