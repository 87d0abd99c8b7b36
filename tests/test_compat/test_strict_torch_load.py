# Copyright (c) mmnanguard contributors. All rights reserved.
"""The ``_safe_torch_load`` mend (onedl-mmengine 0.10.12): no second,
``weights_only=False`` load of a refused file. The crafted files of every
attack class go through it in ``tests/test_security``; here: the mend is in
place where the stack has the function, a stand-in with onedl-mmengine's
fallback is replaced, and honest files, buffers and explicit
``weights_only`` load as before."""

import io

import pytest
import torch
from mmengine.logging.history_buffer import HistoryBuffer
from mmengine.runner import checkpoint as mmengine_checkpoint

from mmnanguard.compat import APPLIED, strict_torch_load
from mmnanguard.compat.checkpoint_allowlist import UntrustedCheckpointError

pytestmark = pytest.mark.stack_smoke


def test_mend_follows_the_stack():
    has_wrapper = hasattr(mmengine_checkpoint, '_safe_torch_load')
    assert APPLIED['strict_torch_load'] is has_wrapper
    if has_wrapper:
        assert (
            mmengine_checkpoint._safe_torch_load
            is strict_torch_load.strict_torch_load
        )
    assert not strict_torch_load.is_needed()


def test_fallback_wrapper_is_replaced(monkeypatch, tmp_path):
    """A stand-in with onedl-mmengine's behaviour: refused -> load again
    with ``weights_only=False``."""
    calls = []

    def falling_back(file, map_location=None, weights_only=None):
        try:
            return torch.load(
                file, map_location=map_location, weights_only=True
            )
        except Exception:
            calls.append('weights_only=False')
            return torch.load(
                file, map_location=map_location, weights_only=False
            )

    monkeypatch.setattr(
        mmengine_checkpoint, '_safe_torch_load', falling_back, raising=False
    )
    assert strict_torch_load.is_needed()
    assert strict_torch_load.apply() is True
    path = str(tmp_path / 'foreign.pth')
    torch.save(dict(buf=HistoryBuffer([1.0], [1]), fn=io.BytesIO), path)
    with pytest.raises(UntrustedCheckpointError) as err:
        mmengine_checkpoint._safe_torch_load(path)
    assert calls == []
    assert path in str(err.value) and '_io.BytesIO' in str(err.value)
    assert strict_torch_load.apply() is False  # idempotent


@pytest.mark.parametrize('as_buffer', [False, True])
def test_honest_checkpoint_loads_equal(tmp_path, as_buffer):
    state = dict(
        state_dict=dict(w=torch.arange(6.0).reshape(2, 3)),
        message_hub=dict(log_scalars=dict(loss=HistoryBuffer([0.5], [1]))),
        meta=dict(iter=3),
    )
    path = str(tmp_path / 'honest.pth')
    torch.save(state, path)
    source = path
    if as_buffer:
        with open(path, 'rb') as f:
            source = io.BytesIO(f.read())
    loaded = strict_torch_load.strict_torch_load(source, map_location='cpu')
    assert torch.equal(loaded['state_dict']['w'], state['state_dict']['w'])
    assert loaded['meta'] == dict(iter=3)
    buffer = loaded['message_hub']['log_scalars']['loss']
    assert buffer.mean() == 0.5


def test_explicit_weights_only_is_passed_unchanged(tmp_path):
    path = str(tmp_path / 'plain.pth')
    torch.save(dict(w=torch.ones(2)), path)
    for flag in (True, False):
        loaded = strict_torch_load.strict_torch_load(path, weights_only=flag)
        assert torch.equal(loaded['w'], torch.ones(2))
