# Copyright (c) mmnanguard contributors. All rights reserved.
"""A race on a shared work dir: another process swaps a checkpoint for a
crafted file between the check of its declared sizes and the load.

Every load opens the file once (``safe_load.weights_only_load``): the sizes
are checked on that descriptor and torch reads the same descriptor, so a
file renamed over the name in between is never read. The swap is made
deterministic by wrapping the size check: it swaps right after the check
of the genuine file has passed.
"""

import os

import crafted_files as crafted
import pytest
import torch

from mmnanguard.compat import safe_load
from mmnanguard.compat.checkpoint_allowlist import load_from_local

GiB = 1 << 30


def _genuine(path: str) -> dict:
    checkpoint = dict(
        meta=dict(iter=3, epoch=1),
        state_dict=dict(weight=torch.arange(12.0).reshape(3, 4)),
    )
    torch.save(checkpoint, path)
    return checkpoint


def _bomb(path: str) -> None:
    torch.save(dict(state_dict=dict(weight=torch.zeros(4))), path)
    crafted.write_bomb(path, 'data.pkl', 2 * GiB)


def _code(path: str, marker: str) -> None:
    crafted.write_zip(path, crafted.foreign_call(marker))


@pytest.fixture
def swap_after_check(monkeypatch):
    """Make the size check rename ``swapped[0]`` over ``swapped[1]`` once
    the genuine file has passed."""
    swapped = []
    check = safe_load.check_declared_sizes

    def check_then_swap(file, what, name=None):
        check(file, what, name)
        if swapped:
            os.replace(*swapped)
            swapped.clear()

    monkeypatch.setattr(safe_load, 'check_declared_sizes', check_then_swap)
    return swapped


@pytest.mark.parametrize('crafted_kind', ['bomb', 'code'])
def test_a_file_swapped_after_the_check_is_not_read(
    tmp_path, swap_after_check, crafted_kind
):
    path = str(tmp_path / 'iter_3.pth')
    genuine = _genuine(path)
    other = str(tmp_path / 'crafted.pth')
    marker = tmp_path / 'ran'
    if crafted_kind == 'bomb':
        _bomb(other)
    else:
        _code(other, str(marker))
    crafted_bytes = open(other, 'rb').read()
    swap_after_check.extend([other, path])

    loaded = load_from_local(path, map_location='cpu')

    assert not swap_after_check  # the swap happened
    assert open(path, 'rb').read() == crafted_bytes  # the name now crafted
    assert loaded['meta'] == genuine['meta']
    assert torch.equal(
        loaded['state_dict']['weight'], genuine['state_dict']['weight']
    )
    assert not marker.exists()


def test_the_swapped_in_file_is_refused_on_its_own(tmp_path):
    # the control: the same crafted files, loaded by name, are refused
    bomb = str(tmp_path / 'bomb.pth')
    _bomb(bomb)
    with pytest.raises(ValueError, match='bomb.pth'):
        load_from_local(bomb, map_location='cpu')
    code = str(tmp_path / 'code.pth')
    marker = tmp_path / 'ran'
    _code(code, str(marker))
    with pytest.raises(Exception, match='code.pth'):
        load_from_local(code, map_location='cpu')
    assert not marker.exists()


def test_a_buffer_and_a_fifo_are_passed_through(tmp_path):
    path = str(tmp_path / 'iter_3.pth')
    genuine = _genuine(path)
    with open(path, 'rb') as file:
        loaded = safe_load.weights_only_load(file, [], 'checkpoint')
    assert torch.equal(
        loaded['state_dict']['weight'], genuine['state_dict']['weight']
    )
    fifo = str(tmp_path / 'fifo.pth')
    os.mkfifo(fifo)
    with safe_load._opened_once(fifo) as opened:
        assert opened == fifo  # never opened for reading here
