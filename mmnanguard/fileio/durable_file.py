# Copyright (c) mmnanguard contributors. All rights reserved.
"""Write a file so that, after any crash, it is complete or absent.

:func:`write_durable` writes the bytes to a temporary file created in the
same folder (:func:`tempfile.mkstemp`: ``O_CREAT | O_EXCL``, so a link
planted under that name is never followed), flushes and ``fsync``\\ s it,
renames it over the final name with :func:`os.replace` (atomic on POSIX;
a link already at the final name is replaced, not followed) and
``fsync``\\ s the folder, so that the rename itself survives a power loss.
A reader sees the old file or the new one, never a part of either; a kill
at any point leaves at most a temporary file, named
``.<final name>.<random><TEMP_SUFFIX>``, which :func:`remove_temp_files`
removes at the next start.

Nothing is written by name after the temporary file is created: the
bytes go through its descriptor (:func:`write_durable`, or, for a writer
that opens the file itself, ``/proc/self/fd/<fd>``:
:func:`write_durable_by`), and the rename happens only while the
temporary name still holds that very file (same device and inode), so a
process that swaps the name for a link meanwhile wins nothing.

On a write error (a full disk: ``ENOSPC``) the temporary file is removed
and :class:`DurableWriteError` (an ``OSError`` with the same ``errno``)
names the file; the file under the final name is unchanged.
"""

import errno
import os
import os.path as osp
import stat
import tempfile
from typing import Callable, List, Optional, Tuple, Union

#: The suffix of the temporary files of :func:`write_durable`.
TEMP_SUFFIX = '.nanguard-tmp'
#: Where Linux names each open descriptor of this process: opening
#: ``/proc/self/fd/<fd>`` reopens the file itself, not a name.
PROC_FDS = '/proc/self/fd'
#: ``O_NOFOLLOW`` where the platform has it.
NOFOLLOW = getattr(os, 'O_NOFOLLOW', 0)


def _current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


#: The mode a file written by ``open(path, 'wb')`` gets (``mkstemp`` makes
#: it 0600); read once at import, while nothing else runs.
FILE_MODE = 0o666 & ~_current_umask()


class DurableWriteError(OSError):
    """A durable write failed; the file under the final name is unchanged.

    ``errno`` is the one of the failed call (``errno.ENOSPC`` for a full
    disk).
    """


def fsync_dir(folder: str) -> None:
    """``fsync`` a folder, so that a rename or removal in it is durable.

    Args:
        folder (str): The folder.
    """
    fd = os.open(folder, os.O_RDONLY | getattr(os, 'O_DIRECTORY', 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` to the file descriptor ``fd``.

    Args:
        fd (int): An open file descriptor.
        data (bytes): What to write.
    """
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def discard(path: str, dir_fd: Optional[int] = None) -> None:
    """Remove a temporary file; one that is already gone is no error.

    Args:
        path (str): The file (relative to ``dir_fd`` when given).
        dir_fd (int, optional): A descriptor of the folder ``path`` is
            relative to. Defaults to None (``path`` as it is).
    """
    try:
        os.unlink(path, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


def write_durable(path: str, data: Union[bytes, str]) -> None:
    """Write ``data`` to ``path``: complete or absent, never a part.

    Args:
        path (str): The final file name. Its folder must exist.
        data (bytes | str): The content (a str is written as UTF-8).

    Raises:
        DurableWriteError: A write, ``fsync`` or rename failed (a full
            disk, a read-only folder); ``path`` is unchanged and no
            temporary file is left.
    """
    if isinstance(data, str):
        data = data.encode('utf-8')

    def write(fd: int, tmp: str) -> None:
        write_all(fd, data)

    _durable(path, write)


def write_durable_by(path: str, write: Callable[[str], None]) -> None:
    """Let ``write`` write ``path``'s content through a name that leads to
    the temporary file's descriptor, then publish it as
    :func:`write_durable` does.

    For a writer that opens its file itself (mmengine's strategies write a
    checkpoint with ``open(name, 'wb')``). ``write`` gets
    ``/proc/self/fd/<fd>`` of the temporary file created here with
    ``O_EXCL``: opening it reopens that file, whatever stands under the
    temporary name meanwhile, so a link swapped in for the name is never
    written through. Where ``/proc/self/fd`` is missing, ``write`` gets a
    name in a private folder made with :func:`tempfile.mkdtemp` (mode
    0700: no other user can plant anything in it), whose file is then
    renamed into place.

    Args:
        path (str): The final file name. Its folder must exist.
        write (callable): Called with the name to write.

    Raises:
        DurableWriteError: ``write``, the ``fsync`` or the rename failed
            with an ``OSError``, or the temporary name was swapped for
            another file meanwhile; ``path`` is unchanged and no temporary
            file is left.
    """
    if not osp.isdir(PROC_FDS):
        _durable_in_private_folder(path, write)
        return

    def write_through_descriptor(fd: int, tmp: str) -> None:
        write(osp.join(PROC_FDS, str(fd)))

    _durable(path, write_through_descriptor)


def _durable(path: str, write: Callable[[int, str], None]) -> None:
    """Create the temporary file, ``write(fd, tmp)`` into it, ``fsync``,
    rename it over ``path`` (only while the name still holds that file),
    ``fsync`` the folder; on any error remove the temporary file (an
    ``OSError`` becomes :class:`DurableWriteError`)."""
    folder = osp.dirname(osp.abspath(path))
    name = osp.basename(path)
    try:
        fd, tmp = tempfile.mkstemp(
            prefix=f'.{name}.', suffix=TEMP_SUFFIX, dir=folder
        )
    except OSError as err:
        raise _write_error(path, err) from err
    try:
        try:
            os.fchmod(fd, FILE_MODE)
            write(fd, tmp)
            os.fsync(fd)  # the inode's data, whoever wrote it
            written = os.fstat(fd)
        finally:
            os.close(fd)
        check_same_file(tmp, written)
        os.replace(tmp, path)
    except OSError as err:
        discard(tmp)
        raise _write_error(path, err) from err
    except BaseException:  # a KeyboardInterrupt mid-write: no leftover
        discard(tmp)
        raise
    fsync_dir(folder)


def _durable_in_private_folder(
    path: str, write: Callable[[str], None]
) -> None:
    """``write`` into ``<private folder>/<name>`` (the folder made with
    :func:`tempfile.mkdtemp` next to ``path``), check that a regular file
    came of it, ``fsync`` it, rename it over ``path``; the private folder
    is removed in every case."""
    folder = osp.dirname(osp.abspath(path))
    name = osp.basename(path)
    try:
        private = tempfile.mkdtemp(
            prefix=f'.{name}.', suffix=TEMP_SUFFIX, dir=folder
        )
    except OSError as err:
        raise _write_error(path, err) from err
    tmp = osp.join(private, name)
    try:
        write(tmp)
        fd = os.open(tmp, os.O_RDONLY | NOFOLLOW)
        try:
            written = os.fstat(fd)
            if not stat.S_ISREG(written.st_mode):
                raise OSError(errno.EEXIST, f'{tmp!r} is not a regular file')
            os.fsync(fd)
        finally:
            os.close(fd)
        check_same_file(tmp, written)
        os.replace(tmp, path)
    except OSError as err:
        raise _write_error(path, err) from err
    finally:
        discard(tmp)
        try:
            os.rmdir(private)
        except OSError:
            pass
    fsync_dir(folder)


def check_same_file(name: str, written: os.stat_result) -> None:
    """Raise unless ``name`` (not followed) is the file ``written``
    describes: the temporary name was not swapped meanwhile.

    Args:
        name (str): The temporary name about to be renamed.
        written (os.stat_result): ``fstat`` of the file written.

    Raises:
        OSError: ``EEXIST``, naming ``name`` and what it is now.
    """
    now = os.lstat(name)
    if (now.st_dev, now.st_ino) != (written.st_dev, written.st_ino):
        kind = 'a link' if stat.S_ISLNK(now.st_mode) else 'another file'
        raise OSError(
            errno.EEXIST,
            f'{name!r} was replaced by {kind} while it was written; '
            'nothing was written through it',
        )


def _write_error(path: str, err: OSError) -> DurableWriteError:
    code = err.errno if err.errno is not None else errno.EIO
    reason = err.strerror or str(err)
    return DurableWriteError(
        code,
        f'nanguard: cannot write {path!r}: {reason}; the file under that '
        'name is unchanged and no partial file was left',
    )


def remove_temp_files(folder: str) -> List[str]:
    """Remove the temporary files that a killed :func:`write_durable` left.

    Only regular files named ``.<name>.<random><TEMP_SUFFIX>`` directly in
    ``folder`` are removed (links are left alone). Call it only while no
    other process writes into ``folder`` (at the start of a run).

    Args:
        folder (str): A folder written by :func:`write_durable`.

    Returns:
        list[str]: The paths removed.
    """

    def remove(path: str) -> bool:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
        os.unlink(path)
        return True

    return remove_left_behind(folder, (TEMP_SUFFIX,), remove)


def remove_left_behind(
    folder: str, suffixes: Tuple[str, ...], remove: Callable[[str], bool]
) -> List[str]:
    """Call ``remove(path)`` on every hidden name in ``folder`` ending with
    one of ``suffixes`` (what a killed write left), in name order.

    Args:
        folder (str): The folder; one that cannot be listed has nothing.
        suffixes (tuple[str]): The endings of the names to remove.
        remove (callable): Removes ``path``; returns whether it did. An
            ``OSError`` it raises passes the path over.

    Returns:
        list[str]: The paths removed.
    """
    removed: List[str] = []
    try:
        names = os.listdir(folder)
    except OSError:
        return removed
    for name in sorted(names):
        if not (name.startswith('.') and name.endswith(suffixes)):
            continue
        path = osp.join(folder, name)
        try:
            if remove(path):
                removed.append(path)
        except OSError:
            continue
    return removed


__all__ = [
    'DurableWriteError',
    'TEMP_SUFFIX',
    'check_same_file',
    'discard',
    'fsync_dir',
    'remove_left_behind',
    'remove_temp_files',
    'write_all',
    'write_durable',
    'write_durable_by',
]
