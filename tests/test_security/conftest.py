# Copyright (c) mmnanguard contributors. All rights reserved.
"""The real runs of every family, made once per test session."""

import pytest


@pytest.fixture(scope='session')
def real_runs(family_runs):
    """``real_runs(family)``: that family's run (``tests/family_runs.py``,
    made on first use)."""
    return family_runs
