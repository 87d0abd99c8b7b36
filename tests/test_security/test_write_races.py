# Copyright (c) mmnanguard contributors. All rights reserved.
"""A race on a shared work dir: under ``NanGuardFlexibleRunner`` another
process swaps the checkpoint's temporary file for a link to a victim at
the moment the strategy opens it. The strategy writes through the
temporary file's descriptor, so the victim is never written, and the
swap is refused by name (``DurableWriteError``) before anything is
published.

The swap is made deterministic by a hook: ``before_save_checkpoint`` is
the strategy's callback, called inside ``SingleDeviceStrategy.
save_checkpoint`` right before it writes the file (the temporary file
exists by then).
"""

import os

import pytest
from mmengine.hooks import Hook
from toy_runs import protected_toy_runner

from mmnanguard.engine.runner import NanGuardFlexibleRunner
from mmnanguard.fileio.checkpoint_verify import checkpoint_problem
from mmnanguard.fileio.durable_file import TEMP_SUFFIX, DurableWriteError


class SwapTempForLink(Hook):
    """Swaps every temporary checkpoint file in the work dir for a link to
    ``victim`` when the strategy is about to write it."""

    def __init__(self, victim: str) -> None:
        self.victim = victim
        self.swapped = []

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        for name in os.listdir(runner.work_dir):
            if name.endswith(TEMP_SUFFIX):
                path = os.path.join(runner.work_dir, name)
                os.unlink(path)
                os.symlink(self.victim, path)
                self.swapped.append(name)


def flexible_runner(work_dir) -> NanGuardFlexibleRunner:
    return protected_toy_runner(
        work_dir,
        1,
        NanGuardFlexibleRunner,
        strategy=dict(type='SingleDeviceStrategy'),
    )


def test_flexible_checkpoint_is_written_through_its_descriptor(tmp_path):
    victim = tmp_path / 'victim.txt'
    victim.write_text('keep me')
    swap = SwapTempForLink(str(victim))
    runner = flexible_runner(tmp_path / 'work')
    runner.register_hook(swap, priority='LOWEST')
    with pytest.raises(DurableWriteError) as info:
        runner.train()
    assert len(swap.swapped) == 1
    assert swap.swapped[0].startswith('.iter_1.pth.')
    assert victim.read_text() == 'keep me'
    message = str(info.value)
    assert 'iter_1.pth' in message and 'replaced by a link' in message
    names = os.listdir(tmp_path / 'work')
    assert 'iter_1.pth' not in names
    assert not [n for n in names if n.endswith(TEMP_SUFFIX)]


def test_flexible_checkpoint_without_a_race_is_published(tmp_path):
    """The same run, nobody swapping: ``iter_1.pth`` is a complete regular
    file, written through the descriptor."""
    runner = flexible_runner(tmp_path / 'work')
    runner.train()
    path = tmp_path / 'work' / 'iter_1.pth'
    assert path.is_file() and not path.is_symlink()
    assert checkpoint_problem(str(path), load=True) is None
    assert not [
        n for n in os.listdir(tmp_path / 'work') if n.endswith(TEMP_SUFFIX)
    ]
