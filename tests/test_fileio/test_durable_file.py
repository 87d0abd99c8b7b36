# Copyright (c) mmnanguard contributors. All rights reserved.
"""``write_durable``: a file is complete or absent, links are not
followed, a full disk leaves the old file and no temporary one."""

import errno
import os

import pytest

from mmnanguard.fileio import durable_file
from mmnanguard.fileio.durable_file import (
    TEMP_SUFFIX,
    DurableWriteError,
    remove_temp_files,
    write_durable,
    write_durable_by,
)


def test_writes_and_replaces(tmp_path):
    path = tmp_path / 'last_checkpoint'
    write_durable(str(path), 'first')
    write_durable(str(path), b'second')
    assert path.read_text() == 'second'
    assert sorted(os.listdir(tmp_path)) == ['last_checkpoint']
    # the mode of open(path, 'w'), not mkstemp's 0600
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


def test_fsyncs_file_and_folder(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f'/proc/self/fd/{fd}'))
        real_fsync(fd)

    monkeypatch.setattr(durable_file.os, 'fsync', fsync)
    write_durable(str(tmp_path / 'a.pth'), b'x' * 10)
    assert len(synced) == 2
    assert synced[0].endswith(TEMP_SUFFIX)  # the data, before the rename
    assert synced[1] == str(tmp_path)  # the folder, after it


def test_replaces_a_link_instead_of_following_it(tmp_path):
    outside = tmp_path / 'outside.txt'
    outside.write_text('keep me')
    work = tmp_path / 'work'
    work.mkdir()
    (work / 'last_checkpoint').symlink_to(outside)
    write_durable(str(work / 'last_checkpoint'), 'iter_3.pth')
    assert outside.read_text() == 'keep me'
    assert not (work / 'last_checkpoint').is_symlink()
    assert (work / 'last_checkpoint').read_text() == 'iter_3.pth'


def test_full_disk_keeps_the_old_file_and_leaves_no_temp(
    tmp_path, monkeypatch
):
    path = tmp_path / 'iter_2.pth'
    path.write_bytes(b'complete')
    real_write_all = durable_file.write_all

    def full_disk(fd, data):
        real_write_all(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(durable_file, 'write_all', full_disk)
    with pytest.raises(DurableWriteError) as info:
        write_durable(str(path), b'new content')
    assert info.value.errno == errno.ENOSPC
    assert isinstance(info.value, OSError)
    assert str(path) in str(info.value) and 'nanguard:' in str(info.value)
    assert path.read_bytes() == b'complete'
    assert os.listdir(tmp_path) == ['iter_2.pth']


def test_remove_temp_files_only_removes_ours(tmp_path):
    ours = tmp_path / f'.iter_3.pth.abc123{TEMP_SUFFIX}'
    ours.write_bytes(b'half')
    kept = [
        tmp_path / 'iter_3.pth',
        tmp_path / '.hidden',
        tmp_path / f'not_hidden{TEMP_SUFFIX}',
    ]
    for path in kept:
        path.write_bytes(b'x')
    target = tmp_path / 'target'
    target.write_bytes(b'x')
    link = tmp_path / f'.link{TEMP_SUFFIX}'
    link.symlink_to(target)
    assert remove_temp_files(str(tmp_path)) == [str(ours)]
    assert all(path.exists() for path in kept)
    assert link.is_symlink() and target.exists()


def _open_and_write(data: bytes):
    """A writer that opens its file by name, as mmengine's does."""

    def write(tmp: str) -> None:
        with open(tmp, 'wb') as f:
            f.write(data)

    return write


def _temp_files(folder) -> list:
    return [n for n in os.listdir(folder) if n.endswith(TEMP_SUFFIX)]


def test_write_by_name_publishes_what_the_writer_wrote(tmp_path):
    path = tmp_path / 'iter_3.pth'
    seen = []

    def write(name: str) -> None:
        temps = _temp_files(tmp_path)
        seen.append((name, temps))
        assert len(temps) == 1 and temps[0].startswith('.iter_3.pth.')
        # the name leads to the temporary file's descriptor, not its name
        assert name.startswith('/proc/self/fd/')
        assert os.path.samefile(name, tmp_path / temps[0])
        assert os.path.getsize(name) == 0  # created empty, ours
        assert not path.exists()  # the final name appears only when done
        _open_and_write(b'checkpoint bytes')(name)

    write_durable_by(str(path), write)
    assert path.read_bytes() == b'checkpoint bytes'
    assert len(seen) == 1
    assert os.listdir(tmp_path) == ['iter_3.pth']
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


@pytest.mark.parametrize('fault', ['enospc', 'interrupt'])
def test_write_by_name_failure_keeps_the_old_file(tmp_path, fault):
    path = tmp_path / 'iter_3.pth'
    path.write_bytes(b'complete')

    def write(name: str) -> None:
        _open_and_write(b'half')(name)
        if fault == 'enospc':
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        raise KeyboardInterrupt

    expected = DurableWriteError if fault == 'enospc' else KeyboardInterrupt
    with pytest.raises(expected):
        write_durable_by(str(path), write)
    assert path.read_bytes() == b'complete'
    assert os.listdir(tmp_path) == ['iter_3.pth']


def test_write_by_name_never_writes_through_a_swapped_link(tmp_path):
    """The race of a shared work dir: another process swaps the temporary
    name for a link to a victim just before the writer opens the name it
    was given. The victim keeps its content; the swap is refused by name
    and neither the link nor a checkpoint is published."""
    victim = tmp_path / 'victim.txt'
    victim.write_text('keep me')
    work = tmp_path / 'work'
    work.mkdir()

    def write(name: str) -> None:
        (tmp,) = _temp_files(work)
        os.unlink(work / tmp)
        os.symlink(victim, work / tmp)  # the swap, won by the attacker
        _open_and_write(b'checkpoint bytes')(name)  # mmengine's open()

    with pytest.raises(DurableWriteError, match='replaced by a link'):
        write_durable_by(str(work / 'iter_3.pth'), write)
    assert victim.read_text() == 'keep me'
    assert os.listdir(work) == []


def test_write_by_name_without_proc_uses_a_private_folder(
    tmp_path, monkeypatch
):
    """Where ``/proc/self/fd`` is missing, the writer gets a name in a
    folder only this user can enter (0700); its file is renamed into
    place and the folder removed."""
    monkeypatch.setattr(durable_file, 'PROC_FDS', str(tmp_path / 'no-proc'))
    path = tmp_path / 'iter_3.pth'
    seen = []

    def write(name: str) -> None:
        private = os.path.dirname(name)
        seen.append(os.stat(private).st_mode & 0o777)
        assert os.path.dirname(private) == str(tmp_path)
        assert os.path.basename(name) == 'iter_3.pth'
        _open_and_write(b'checkpoint bytes')(name)

    write_durable_by(str(path), write)
    assert seen == [0o700]
    assert path.read_bytes() == b'checkpoint bytes'
    assert sorted(os.listdir(tmp_path)) == ['iter_3.pth']

    def fail(name: str) -> None:
        _open_and_write(b'half')(name)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with pytest.raises(DurableWriteError):
        write_durable_by(str(path), fail)
    assert path.read_bytes() == b'checkpoint bytes'
    assert sorted(os.listdir(tmp_path)) == ['iter_3.pth']
