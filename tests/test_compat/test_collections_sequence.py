# Copyright (c) mmnanguard contributors. All rights reserved.
import collections
import sys

import pytest

from mmnanguard.compat import collections_sequence as mend


def test_mmrotate_models_import_after_mend():
    import mmrotate.models.detectors.refine_single_stage as m

    assert m.Sequence is collections.abc.Sequence


@pytest.mark.skipif(sys.version_info < (3, 10), reason='alias exists')
def test_is_needed_on_this_stack():
    saved = collections.__dict__.pop('Sequence', None)
    try:
        assert mend.is_needed()
        assert mend.apply() is True
        assert collections.Sequence is collections.abc.Sequence
    finally:
        if saved is not None:
            collections.Sequence = saved


def test_does_nothing_when_alias_present():
    collections.Sequence = collections.abc.Sequence
    assert not mend.is_needed()
    assert mend.apply() is False


def test_does_nothing_for_other_mmrotate(monkeypatch):
    saved = collections.__dict__.pop('Sequence', None)
    try:
        monkeypatch.setattr(mend.metadata, 'version', lambda name: '1.0.0')
        assert not mend.is_needed()
        assert mend.apply() is False
        assert not hasattr(collections, 'Sequence')
    finally:
        if saved is not None:
            collections.Sequence = saved
