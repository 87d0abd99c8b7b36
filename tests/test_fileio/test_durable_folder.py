# Copyright (c) mmnanguard contributors. All rights reserved.
"""A checkpoint folder that every rank writes a part of is complete or
absent (``fileio/durable_folder.py`` and ``durable_checkpoint.
save_in_parts``): real files, a real kill in the middle of the write, and
links planted under every name the write uses. Under 2 gloo processes
with FSDP1 (local state) and DeepSpeed the same path is taken by
``tests/test_distributed/test_fsdp1.py`` and ``test_deepspeed.py``."""

import os
import os.path as osp
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from mmnanguard.engine.runner.durable_checkpoint import save_in_parts
from mmnanguard.fileio.durable_folder import (
    OLD_FOLDER_SUFFIX,
    TEMP_FOLDER_SUFFIX,
    make_private_folder,
    publish,
    remove_temp_folders,
    sync_tree,
    written_path,
)


def _write_parts(folder: str, parts: dict) -> None:
    os.makedirs(folder, exist_ok=True)
    for name, data in parts.items():
        with open(osp.join(folder, name), 'wb') as f:
            f.write(data)


def _contents(folder) -> dict:
    return {
        name: open(osp.join(folder, name), 'rb').read()
        for name in sorted(os.listdir(folder))
    }


def test_the_private_folder_is_hidden_new_and_private(tmp_path):
    path = str(tmp_path / 'iter_4.pth')
    first, second = make_private_folder(path), make_private_folder(path)
    assert first != second
    for private in (first, second):
        name = osp.basename(private)
        assert name.startswith('.iter_4.pth.')
        assert name.endswith(TEMP_FOLDER_SUFFIX)
        assert os.stat(private).st_mode & 0o777 == 0o700
        assert written_path(private, path) == osp.join(private, 'iter_4.pth')


def test_save_in_parts_publishes_what_was_written(tmp_path):
    path = str(tmp_path / 'iter_4.pth')
    parts = {'rank0.pth': b'zero' * 100, 'rank1.pth': b'one' * 100}
    names = []

    def save(name):
        names.append(name)
        _write_parts(name, parts)

    save_in_parts(save, path)
    (name,) = names
    assert osp.basename(name) == 'iter_4.pth'
    assert osp.basename(osp.dirname(name)).endswith(TEMP_FOLDER_SUFFIX)
    assert _contents(path) == parts
    assert os.listdir(tmp_path) == ['iter_4.pth']


def test_save_in_parts_of_one_file(tmp_path):
    # DeepSpeed without the optimizer writes one file from the main process
    path = str(tmp_path / 'iter_4.pth')

    def save(name):
        with open(name, 'wb') as f:
            f.write(b'weights')

    save_in_parts(save, path)
    assert open(path, 'rb').read() == b'weights'
    assert os.listdir(tmp_path) == ['iter_4.pth']


def test_a_failed_write_publishes_nothing(tmp_path):
    path = str(tmp_path / 'iter_4.pth')

    def save(name):
        _write_parts(name, {'rank0.pth': b'half'})
        raise OSError(28, 'No space left on device')

    with pytest.raises(OSError, match='No space'):
        save_in_parts(save, path)
    assert not osp.exists(path)
    # the next write goes into a new private folder; the resume's cleanup
    # removes the old one
    save_in_parts(lambda name: _write_parts(name, {'rank1.pth': b'1'}), path)
    assert _contents(path) == {'rank1.pth': b'1'}
    (left,) = [n for n in os.listdir(tmp_path) if n != 'iter_4.pth']
    assert remove_temp_folders(str(tmp_path)) == [str(tmp_path / left)]
    assert os.listdir(tmp_path) == ['iter_4.pth']


def test_a_folder_already_there_is_replaced_whole(tmp_path):
    path = str(tmp_path / 'iter_4.pth')
    _write_parts(path, {'rank0.pth': b'old', 'rank7.pth': b'old'})
    save_in_parts(lambda name: _write_parts(name, {'rank0.pth': b'new'}), path)
    assert _contents(path) == {'rank0.pth': b'new'}
    assert os.listdir(tmp_path) == ['iter_4.pth']


def test_a_link_at_any_name_is_not_followed(tmp_path):
    victim = tmp_path / 'victim'
    _write_parts(str(victim), {'keep.txt': b'keep'})
    work = tmp_path / 'work'
    work.mkdir()
    path = str(work / 'iter_4.pth')
    os.symlink(victim, path)
    os.symlink(victim, str(work / f'.iter_4.pth{OLD_FOLDER_SUFFIX}'))
    save_in_parts(lambda name: _write_parts(name, {'rank0.pth': b'n'}), path)
    assert _contents(path) == {'rank0.pth': b'n'}
    assert not osp.islink(path)
    assert _contents(victim) == {'keep.txt': b'keep'}
    # the planted old-name link is not the old folder: it stays, unfollowed
    # until the resume's cleanup unlinks it
    assert remove_temp_folders(str(work)) == [
        str(work / f'.iter_4.pth{OLD_FOLDER_SUFFIX}')
    ]
    assert sorted(os.listdir(work)) == ['iter_4.pth']
    assert _contents(victim) == {'keep.txt': b'keep'}


def test_a_folder_is_not_renamed_over_an_old_file(tmp_path):
    path = str(tmp_path / 'iter_4.pth')
    open(path, 'wb').write(b'an older one-file checkpoint')
    save_in_parts(lambda name: _write_parts(name, {'rank0.pth': b'0'}), path)
    assert _contents(path) == {'rank0.pth': b'0'}


def test_sync_tree_syncs_every_file_and_skips_links(tmp_path):
    folder = tmp_path / 'parts'
    _write_parts(str(folder), {'a': b'1', 'b': b'2'})
    _write_parts(str(folder / 'sub'), {'c': b'3'})
    os.symlink(tmp_path / 'nowhere', folder / 'link')
    assert sync_tree(str(folder)) == 3
    single = tmp_path / 'one.pth'
    single.write_bytes(b'x')
    assert sync_tree(str(single)) == 1
    with pytest.raises(FileNotFoundError):
        sync_tree(str(tmp_path / 'never_written'))


def test_publish_replaces_an_older_file_atomically(tmp_path):
    path = str(tmp_path / 'iter_4.pth')
    open(path, 'wb').write(b'old')
    private = make_private_folder(path)
    open(written_path(private, path), 'wb').write(b'new')
    publish(private, path)
    assert open(path, 'rb').read() == b'new'
    assert os.listdir(tmp_path) == ['iter_4.pth']


def test_remove_temp_folders_removes_only_what_a_write_left(tmp_path):
    victim = tmp_path / 'victim'
    _write_parts(str(victim), {'keep.txt': b'keep'})
    work = tmp_path / 'work'
    _write_parts(
        str(work / '.iter_2.pth.x1y2.nanguard-tmpdir' / 'iter_2.pth'),
        {'rank0.pth': b''},
    )
    _write_parts(str(work / '.iter_1.pth.nanguard-olddir'), {'rank0.pth': b''})
    os.symlink(victim, work / '.iter_3.pth.nanguard-tmpdir')
    _write_parts(str(work / 'iter_2.pth'), {'rank0.pth': b'done'})
    _write_parts(str(work / 'nanguard-tmpdir'), {'x': b''})  # not hidden
    removed = remove_temp_folders(str(work))
    assert sorted(osp.basename(p) for p in removed) == [
        '.iter_1.pth.nanguard-olddir',
        '.iter_2.pth.x1y2.nanguard-tmpdir',
        '.iter_3.pth.nanguard-tmpdir',
    ]
    assert sorted(os.listdir(work)) == ['iter_2.pth', 'nanguard-tmpdir']
    assert _contents(victim) == {'keep.txt': b'keep'}


KILLED_WRITER = textwrap.dedent(
    """
    import os, sys, time
    from mmnanguard.engine.runner.durable_checkpoint import save_in_parts

    def save(name):
        os.makedirs(name)  # FSDP's and DeepSpeed's own mkdir
        with open(os.path.join(name, 'rank0.pth'), 'wb') as f:
            f.write(b'0' * 4096)
        open(sys.argv[2], 'w').close()  # the first part is written
        time.sleep(60)  # killed here, before rank1.pth

    save_in_parts(save, sys.argv[1])
    """
)


def test_a_kill_mid_write_leaves_the_name_absent(tmp_path):
    work = tmp_path / 'work'
    work.mkdir()
    path = str(work / 'iter_4.pth')
    ready = tmp_path / 'ready'
    proc = subprocess.Popen(
        [sys.executable, '-c', KILLED_WRITER, path, str(ready)]
    )
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert proc.poll() is None, 'the writer ended early'
            assert time.monotonic() < deadline, 'the writer never wrote'
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not osp.exists(path)  # no folder with a part missing
    (left,) = os.listdir(work)
    assert left.startswith('.iter_4.pth.') and left.endswith(
        TEMP_FOLDER_SUFFIX
    )
    assert remove_temp_folders(str(work)) == [str(work / left)]
    assert os.listdir(work) == []
