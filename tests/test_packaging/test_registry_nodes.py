# Copyright (c) mmnanguard contributors. All rights reserved.
"""The registry module says how many registry nodes it defines."""

import re

from mmengine.registry import Registry

import mmnanguard.registry as registry


def test_docstring_counts_the_registry_nodes():
    nodes = {
        name: value
        for name, value in vars(registry).items()
        if isinstance(value, Registry) and value.scope == 'mmnanguard'
    }
    said = re.search(r'provides (\d+) registry nodes', registry.__doc__)
    assert said is not None
    assert int(said.group(1)) == len(nodes), sorted(nodes)
