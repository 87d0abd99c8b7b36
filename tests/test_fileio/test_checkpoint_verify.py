# Copyright (c) mmnanguard contributors. All rights reserved.
"""Which checkpoints verify, newest first, and which one a protected
resume takes (real mmengine checkpoints of a toy run)."""

import os
import os.path as osp
import shutil

import pytest
import torch
from mmengine.hooks import Hook

from mmnanguard.compat.checkpoint_allowlist import load_from_local
from mmnanguard.engine.runner import (
    NanGuardRunner,
    UnusableCheckpointError,
    checkpoint_problem,
    choose_resume_checkpoint,
    verified_checkpoints,
)
from mmnanguard.fileio.checkpoint_verify import truncation_problem
from mmnanguard.testing.toy import toy_runner_cfg

PROTECTION = dict(
    policy='skip', hooks=[], check_labels=False, validate_annotations=None
)


def toy_runner(work_dir, max_iters, **kwargs):
    cfg = toy_runner_cfg(
        str(work_dir), max_iters=max_iters, nanguard=PROTECTION, **kwargs
    )
    cfg['default_hooks']['checkpoint'] = dict(
        type='CheckpointHook', interval=1, by_epoch=False
    )
    return NanGuardRunner(**cfg)


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    """A work dir with iter_1..3.pth and last_checkpoint naming iter_3."""
    work_dir = tmp_path_factory.mktemp('trained')
    toy_runner(work_dir, 3).train()
    return str(work_dir)


@pytest.fixture
def work(trained, tmp_path):
    """A copy of ``trained`` (mtimes kept), last_checkpoint rewritten."""
    work_dir = str(tmp_path / 'work')
    shutil.copytree(trained, work_dir)
    with open(osp.join(work_dir, 'last_checkpoint'), 'w') as f:
        f.write(osp.join(work_dir, 'iter_3.pth'))
    return work_dir


def ckpt(work_dir, n):
    return osp.join(work_dir, f'iter_{n}.pth')


def truncate(path, keep=0.5):
    size = os.path.getsize(path)
    with open(path, 'r+b') as f:
        f.truncate(int(size * keep))


def test_complete_checkpoints_verify_newest_first(work):
    assert verified_checkpoints(work) == [ckpt(work, n) for n in (3, 2, 1)]
    for n in (1, 2, 3):
        assert checkpoint_problem(ckpt(work, n), load=True) is None


@pytest.mark.parametrize(
    'keep, words',
    [
        (0.0, 'it is empty'),
        (0.5, 'not a complete zip archive'),
        (0.999, 'not a complete zip archive'),
    ],
)
def test_truncated_checkpoint_is_refused_without_loading(work, keep, words):
    truncate(ckpt(work, 3), keep)
    assert words in checkpoint_problem(ckpt(work, 3))
    assert verified_checkpoints(work) == [ckpt(work, 2), ckpt(work, 1)]


def test_damaged_pickle_and_foreign_files(work, tmp_path):
    # a flipped byte inside data.pkl: the CRC check of the cheap check
    path = ckpt(work, 3)
    with open(path, 'r+b') as f:
        data = f.read()
        at = data.index(b'state_dict')
        f.seek(at)
        f.write(b'STATE_DICT')
    assert checkpoint_problem(path) == (
        'its data.pkl is damaged: BadZipFile: Bad CRC-32 for file '
        "'archive/data.pkl'"
    )
    other = tmp_path / 'weights.pth'
    torch.save({'weights': torch.ones(2)}, str(other))
    assert 'not an mmengine checkpoint' in checkpoint_problem(str(other))
    assert checkpoint_problem(str(tmp_path / 'missing.pth')) == (
        'it does not exist'
    )
    assert checkpoint_problem('') == 'no file is named'


def test_newest_is_by_modification_time(work):
    # after a resume from iter_1, the run's new iter_2 is newer than an
    # iter_3 left behind by the discarded part
    now = os.stat(ckpt(work, 3)).st_mtime_ns
    os.utime(ckpt(work, 3), ns=(now, now + 10**9))
    os.utime(ckpt(work, 2), ns=(now, now + 2 * 10**9))
    assert verified_checkpoints(work)[:2] == [ckpt(work, 2), ckpt(work, 3)]


def test_out_dir_elsewhere_is_found_through_last_checkpoint(work, tmp_path):
    out = tmp_path / 'out' / 'work'
    out.mkdir(parents=True)
    for n in (1, 2, 3):
        shutil.move(ckpt(work, n), str(out / f'iter_{n}.pth'))
    with open(osp.join(work, 'last_checkpoint'), 'w') as f:
        f.write(str(out / 'iter_3.pth'))
    truncate(str(out / 'iter_3.pth'))
    assert verified_checkpoints(work) == [
        str(out / 'iter_2.pth'),
        str(out / 'iter_1.pth'),
    ]


# -- which checkpoint a resume takes ---------------------------------------
def test_resume_takes_what_last_checkpoint_names(work):
    choice = choose_resume_checkpoint(work)
    assert choice.path == ckpt(work, 3) and choice.message() is None


def test_resume_passes_over_a_truncated_newest(work):
    truncate(ckpt(work, 3))
    choice = choose_resume_checkpoint(work)
    assert choice.path == ckpt(work, 2)
    message = choice.message()
    assert message.startswith('nanguard: last_checkpoint names')
    assert 'iter_3.pth' in message and 'not a complete zip' in message


@pytest.mark.parametrize('content', ['', '   \n', None])
def test_resume_without_usable_last_checkpoint(work, content):
    marker = osp.join(work, 'last_checkpoint')
    if content is None:
        os.remove(marker)
    else:
        with open(marker, 'w') as f:
            f.write(content)
    choice = choose_resume_checkpoint(work)
    assert choice.path == ckpt(work, 3)
    expected = 'empty' if content is not None else 'no last_checkpoint'
    assert expected in choice.message()


def test_resume_takes_a_newer_complete_checkpoint(work):
    # killed after iter_4 was renamed into place, before last_checkpoint
    shutil.copy2(ckpt(work, 3), ckpt(work, 4))
    os.utime(ckpt(work, 4), ns=(1, os.stat(ckpt(work, 3)).st_mtime_ns + 1))
    choice = choose_resume_checkpoint(work)
    assert choice.path == ckpt(work, 4)
    assert 'a newer complete checkpoint exists' in choice.message()


def test_nothing_loads_starts_from_scratch(work):
    for n in (1, 2, 3):
        truncate(ckpt(work, n))
    choice = choose_resume_checkpoint(work)
    assert choice.path is None
    assert 'training starts from scratch' in choice.message()


def test_named_checkpoint_falls_back_or_raises(work, tmp_path):
    truncate(ckpt(work, 3))
    choice = choose_resume_checkpoint(work, ckpt(work, 3))
    assert choice.path == ckpt(work, 2)
    assert choice.message().startswith('nanguard: --resume named')
    elsewhere = tmp_path / 'elsewhere'
    elsewhere.mkdir()
    bad = elsewhere / 'iter_9.pth'
    bad.write_bytes(b'PK\x03\x04 not a whole archive')
    empty_work = tmp_path / 'empty_work'
    empty_work.mkdir()
    with pytest.raises(UnusableCheckpointError) as info:
        choose_resume_checkpoint(str(empty_work), str(bad))
    assert str(bad) in str(info.value)
    assert 'not a complete zip archive' in str(info.value)


def test_protected_runner_resumes_from_the_newest_that_loads(work):
    truncate(ckpt(work, 3))
    with open(osp.join(work, 'last_checkpoint'), 'w'):
        pass  # empty, as a bare kill leaves it
    saved = load_from_local(ckpt(work, 2), map_location='cpu')
    runner = toy_runner(work, 4, resume=True)
    seen = {}

    class StartProbe(Hook):
        def before_train(self, runner):
            seen['iter'] = runner.iter
            seen['state'] = {
                k: v.clone() for k, v in runner.model.state_dict().items()
            }

    runner.register_hook(StartProbe(), priority='LOWEST')
    runner.train()
    assert seen['iter'] == 2
    for key, value in saved['state_dict'].items():
        torch.testing.assert_close(seen['state'][key], value, rtol=0, atol=0)
    assert runner.iter == 4
    with open(osp.join(work, 'last_checkpoint')) as f:
        assert f.read() == ckpt(work, 4)
    assert verified_checkpoints(work)[:3] == [
        ckpt(work, 4),
        ckpt(work, 3),
        ckpt(work, 2),
    ]


def test_cut_short_load_from_is_refused_by_name(work, tmp_path):
    truncate(ckpt(work, 3))
    runner = toy_runner(tmp_path / 'finetune', 1, load_from=ckpt(work, 3))
    with pytest.raises(UnusableCheckpointError) as info:
        runner.train()
    assert f"load_from='{ckpt(work, 3)}'" in str(info.value)
    assert 'not a complete zip archive' in str(info.value)
    # plain weights, zip or torch's legacy format, are left to mmengine
    legacy = tmp_path / 'legacy.pth'
    state = {'weight': torch.ones(3)}
    torch.save(state, str(legacy), _use_new_zipfile_serialization=False)
    plain = tmp_path / 'plain.pth'
    torch.save(state, str(plain))
    assert truncation_problem(str(legacy)) is None
    assert truncation_problem(str(plain)) is None
    assert truncation_problem(ckpt(work, 2)) is None
