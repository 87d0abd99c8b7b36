# Copyright (c) mmnanguard contributors. All rights reserved.
"""A resume passes over, unread, a checkpoint that declares far more bytes
than a checkpoint of the model holds (``checkpoint_fit.FitCheck``): the
toy model's parameters take a few hundred bytes, so its bound is 64 MiB
and a little more; a real 65 MiB file (an honest one: no entry inflates)
in the place of the newest checkpoint is never handed to ``torch.load``.
"""

import os.path as osp

import pytest
import torch
from toy_runs import protected_toy_runner

from mmnanguard.compat import safe_load
from mmnanguard.engine.runner import UnusableCheckpointError
from mmnanguard.engine.runner.checkpoint_fit import SLACK_BYTES
from mmnanguard.engine.runner.resume_choice import choose_resume_checkpoint
from mmnanguard.fileio.checkpoint_verify import checkpoint_problem

pytestmark = pytest.mark.slow


def _pad(path: str) -> None:
    """Add a tensor of ``SLACK_BYTES`` to the checkpoint ``path``."""
    checkpoint = torch.load(path, weights_only=False)
    checkpoint['state_dict']['padding'] = torch.zeros(SLACK_BYTES // 4)
    torch.save(checkpoint, path)


@pytest.fixture
def work(tmp_path, monkeypatch):
    """A toy run of 3 iterations whose newest checkpoint is padded; the
    files handed to ``torch.load`` from then on are in ``opened``."""
    work = str(tmp_path / 'work')
    protected_toy_runner(work, 3).train()
    _pad(osp.join(work, 'iter_3.pth'))
    opened = []
    load = safe_load.torch.load

    def spy(file, *args, **kwargs):
        opened.append(getattr(file, 'name', file))
        return load(file, *args, **kwargs)

    monkeypatch.setattr(safe_load.torch, 'load', spy)
    return work, opened


def test_the_padded_file_is_a_checkpoint_otherwise(work):
    work, _ = work
    assert checkpoint_problem(osp.join(work, 'iter_3.pth'), load=True) is None


def test_resume_passes_over_it_unread(work):
    work, opened = work
    runner = protected_toy_runner(work, 4, resume=True)
    runner.train()
    assert runner.iter == 4
    newest = osp.join(work, 'iter_3.pth')
    assert newest not in opened
    assert osp.join(work, 'iter_2.pth') in opened
    choice = choose_resume_checkpoint(work)  # iter_4 now fits
    assert choice.path == osp.join(work, 'iter_4.pth')


def test_named_with_no_fitting_one_it_is_refused(work, tmp_path):
    work, opened = work
    alone = tmp_path / 'alone'
    alone.mkdir()
    named = str(alone / 'iter_3.pth')
    with open(osp.join(work, 'iter_3.pth'), 'rb') as src:
        open(named, 'wb').write(src.read())
    runner = protected_toy_runner(alone, 4, resume=True, load_from=named)
    with pytest.raises(UnusableCheckpointError) as err:
        runner.train()
    message = str(err.value)
    assert f'cannot resume from {named!r}: it does not fit' in message
    assert 'declares 64.0 MiB of records, more than 8 times the' in message
    assert named not in opened
