# Copyright (c) mmnanguard contributors. All rights reserved.
"""The one function through which a protected run removes checkpoints:
only a regular file of a checkpoint's name directly in the checkpoint
folder, or a checkpoint folder of regular files only; never a link's
target, never a folder holding anything else, never a file elsewhere."""

import os
import os.path as osp

import pytest

from mmnanguard.engine.runner.checkpoint_removal import (
    MISSING,
    CheckpointRemovalBackend,
    checkpoint_names,
    remove_checkpoint_file,
)

NAMES = checkpoint_names('iter_{}.pth')
A_LINK = 'it is not a regular file or a checkpoint folder (a link)'


@pytest.fixture
def folders(tmp_path):
    work = tmp_path / 'work'
    outside = tmp_path / 'outside'
    work.mkdir()
    outside.mkdir()
    return str(work), str(outside)


def _file(path, text='data'):
    with open(path, 'w') as f:
        f.write(text)
    return path


@pytest.mark.parametrize(
    'name, matches',
    [
        ('iter_3.pth', True),
        ('epoch_12.pth', True),
        ('best_coco_bbox_mAP_iter_3.pth', True),
        ('iter_.pth', False),
        ('iter_3.pth.bak', False),
        ('victim.txt', False),
        ('iter_/../../../victim.pth', False),
        ('best_a/b_iter_3.pth', False),
    ],
)
def test_checkpoint_names(name, matches):
    assert bool(NAMES.fullmatch(name)) is matches


def test_custom_template_names():
    names = checkpoint_names('ckpt-{:06d}.pt')
    assert names.fullmatch('ckpt-000012.pt')
    assert not names.fullmatch('ckpt-x.pt')


def test_a_regular_checkpoint_file_is_removed(folders):
    work, _ = folders
    path = _file(osp.join(work, 'iter_2.pth'))
    assert remove_checkpoint_file(work, path, NAMES) is None
    assert not osp.exists(path)
    assert remove_checkpoint_file(work, path, NAMES) == MISSING


@pytest.mark.parametrize('target', ['file', 'folder'])
def test_a_link_is_kept_and_so_is_its_target(folders, target):
    """A link named like a checkpoint, to a file or to a folder of
    checkpoint parts outside: neither the link nor the target goes."""
    work, outside = folders
    victim = _file(osp.join(outside, 'mp_rank_00_model_states.pt'))
    link = osp.join(work, 'iter_9.pth')
    os.symlink(victim if target == 'file' else outside, link)
    problem = remove_checkpoint_file(work, link, NAMES)
    assert problem == A_LINK
    assert osp.isfile(victim) and osp.islink(link)


def test_a_checkpoint_folder_of_regular_files_is_removed(folders):
    work, _ = folders
    folder = osp.join(work, 'iter_4.pth')
    os.makedirs(folder)
    for name in ('mp_rank_00_model_states.pt', 'zero_pp_rank_1_optim.pt'):
        _file(osp.join(folder, name))
    assert remove_checkpoint_file(work, folder, NAMES) is None
    assert os.listdir(work) == []
    assert remove_checkpoint_file(work, folder, NAMES) == MISSING


@pytest.mark.parametrize('inside', ['link', 'folder'])
def test_a_folder_holding_anything_else_is_kept_whole(folders, inside):
    work, outside = folders
    victim = _file(osp.join(outside, 'victim.txt'))
    folder = osp.join(work, 'iter_4.pth')
    os.makedirs(folder)
    part = _file(osp.join(folder, 'a_part.pt'))
    if inside == 'link':
        os.symlink(victim, osp.join(folder, 'b_entry'))
    else:
        os.makedirs(osp.join(folder, 'b_entry'))
        _file(osp.join(folder, 'b_entry', 'nested'))
    problem = remove_checkpoint_file(work, folder, NAMES)
    assert problem == (
        "it is a folder whose entry 'b_entry' is not a regular file (a "
        "checkpoint folder holds only the ranks' files)"
    )
    assert osp.isfile(part) and osp.isfile(victim)
    assert sorted(os.listdir(folder)) == ['a_part.pt', 'b_entry']


@pytest.mark.parametrize(
    'relative', ['../outside/iter_5.pth', 'sub/../../outside/iter_5.pth']
)
def test_a_file_outside_the_folder_is_kept(folders, relative):
    work, outside = folders
    os.makedirs(osp.join(work, 'sub'))
    victim = _file(osp.join(outside, 'iter_5.pth'))
    problem = remove_checkpoint_file(work, osp.join(work, relative), NAMES)
    assert problem == f'it is not directly in the checkpoint folder {work!r}'
    assert osp.isfile(victim)


def test_a_file_of_another_name_is_kept(folders):
    work, _ = folders
    path = _file(osp.join(work, 'notes.txt'))
    problem = remove_checkpoint_file(work, path, NAMES)
    assert problem.startswith('its name is not one a CheckpointHook writes')
    assert osp.isfile(path)


def test_the_backend_removes_files_and_folders_through_the_check(folders):
    work, outside = folders

    class Backend:
        removed = []

        def remove(self, path):  # never reached for a local folder
            self.removed.append(path)

        def join_path(self, *parts):
            return osp.join(*parts)

    backend = CheckpointRemovalBackend(Backend(), work, NAMES)
    assert backend.join_path(work, 'x') == osp.join(work, 'x')
    backend.rmtree(outside)
    victim = _file(osp.join(outside, 'victim.txt'))
    backend.remove(victim)
    assert osp.isdir(outside) and osp.isfile(victim)
    assert Backend.removed == []
    path = _file(osp.join(work, 'iter_1.pth'))
    backend.remove(path)
    assert not osp.exists(path)
    checkpoint = osp.join(work, 'iter_2.pth')
    os.makedirs(checkpoint)
    _file(osp.join(checkpoint, 'rank0.pth'))
    backend.rmtree(checkpoint)
    assert os.listdir(work) == []
