# Copyright (c) mmnanguard contributors. All rights reserved.
"""The real runs of every family, made once per test run."""

import pytest
from real_runs import FAMILIES, run_family


@pytest.fixture(scope='session')
def real_runs(request, tmp_path_factory):
    """``real_runs(family)``: that family's run (made on first use)."""
    done = {}

    def get(family):
        if family not in done:
            data_root = request.getfixturevalue(FAMILIES[family][1])
            tmp_dir = str(tmp_path_factory.mktemp(family))
            done[family] = run_family(family, tmp_dir, data_root)
        return done[family]

    return get
