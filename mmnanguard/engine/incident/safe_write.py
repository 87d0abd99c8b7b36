# Copyright (c) mmnanguard contributors. All rights reserved.
"""Write into an incident folder: a file is complete or absent.

* Every file is created under a fresh temporary name (``.tmp_<name>.<random>``)
  with ``O_CREAT | O_EXCL | O_NOFOLLOW`` (it cannot exist, and a link
  planted under that name is not followed), flushed, ``fsync``-ed and
  renamed over its final name with :func:`os.replace`; then the folder is
  ``fsync``-ed. ``rename(2)`` does not follow a link at the destination: a
  link named ``report.md`` is replaced by the file, never written through.
* The folder itself is opened with ``O_NOFOLLOW | O_DIRECTORY`` (an
  incident folder relative to its incident root, opened the same way) and
  every operation is relative to that descriptor, so a folder that is a
  link is refused, and one swapped for a link meanwhile is not followed
  either.
* A finished incident folder is renamed into place with
  :func:`rename_noreplace`, which never replaces anything.

:mod:`mmnanguard.fileio.durable_file` writes checkpoints the same way, by
path; the incident writes are relative to a folder descriptor (so that no
link is followed at any step) and share its byte writing and temporary
file removal (:func:`~mmnanguard.fileio.durable_file.write_all`,
:func:`~mmnanguard.fileio.durable_file.discard`).
"""

import ctypes
import errno
import functools
import json
import logging
import os
import os.path as osp
import secrets
from typing import Any, BinaryIO, Callable, Tuple, Union

from mmengine.logging import print_log

from mmnanguard.fileio.durable_file import discard, write_all

from .names import (
    INCIDENT_DIR_RE,
    REPORT_NAME,
    TEMP_DIR_PREFIX,
    TEMP_PREFIX,
    UnsafeIncidentFolderError,
    describe_entry,
)

#: How incident folders are opened: never through a link.
DIR_FLAGS = (
    os.O_RDONLY
    | getattr(os, 'O_DIRECTORY', 0)
    | getattr(os, 'O_NOFOLLOW', 0)
    | getattr(os, 'O_CLOEXEC', 0)
)
_NEW_FILE_FLAGS = (
    os.O_WRONLY
    | os.O_CREAT
    | os.O_EXCL
    | getattr(os, 'O_NOFOLLOW', 0)
    | getattr(os, 'O_CLOEXEC', 0)
)
#: What :func:`write_incident_file` writes: bytes, text (UTF-8), or a
#: function that writes into the binary file object it is given.
Payload = Union[bytes, str, Callable[[BinaryIO], Any]]


def open_folder(folder: str) -> int:
    """A descriptor of ``folder``, which must be a real folder, not a link.

    Args:
        folder (str): The folder.

    Returns:
        int: A descriptor opened with :data:`DIR_FLAGS`; the caller closes
        it.

    Raises:
        UnsafeIncidentFolderError: ``folder`` is a link or not a folder.
        OSError: It cannot be opened (it does not exist, permissions).
    """
    try:
        return os.open(folder, DIR_FLAGS)
    except OSError as err:
        if err.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
    raise UnsafeIncidentFolderError(
        f'nanguard: refusing to write into {folder!r}: it is '
        f'{describe_entry(folder)}; expected a real folder (incident '
        'files are never written through a link)'
    )


def open_incident_folder(folder: str) -> int:
    """A descriptor of the incident ``folder``, no link followed from the
    run's work dir down.

    An incident folder (``incident_NNN_iterNNNNNN``) lies in the run's
    incident root (``work_dir/nanguard``): both are opened with
    :data:`DIR_FLAGS`, the folder relative to the root's descriptor, so a
    root swapped for a link after the incident was recorded is not
    followed either. Any other folder is opened as :func:`open_folder`
    does.

    Args:
        folder (str): The incident folder.

    Returns:
        int: A descriptor opened with :data:`DIR_FLAGS`; the caller closes
        it.

    Raises:
        UnsafeIncidentFolderError: The folder or its incident root is a
            link or not a folder.
        OSError: It cannot be opened (it does not exist, permissions).
    """
    root, name = osp.split(osp.normpath(folder))
    if not INCIDENT_DIR_RE.match(name):
        return open_folder(folder)
    root_fd = open_folder(root)
    try:
        return os.open(name, DIR_FLAGS, dir_fd=root_fd)
    except OSError as err:
        if err.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
    finally:
        os.close(root_fd)
    raise UnsafeIncidentFolderError(
        f'nanguard: refusing to write into {folder!r}: it is '
        f'{describe_entry(folder)}; expected a real folder (incident '
        'files are never written through a link)'
    )


def _check_name(name: str) -> None:
    if (
        not name
        or name in ('.', '..')
        or os.sep in name
        or (os.altsep and os.altsep in name)
        or name.startswith(TEMP_PREFIX)
    ):
        raise ValueError(
            f'nanguard: incident file name {name!r} is invalid; expected a '
            f'plain file name such as {REPORT_NAME!r}, not starting with '
            f'{TEMP_PREFIX!r}'
        )


def _new_temp_file(dir_fd: int, name: str) -> Tuple[str, int]:
    """Create ``.tmp_<name>.<random>`` in ``dir_fd``, exclusively."""
    for _ in range(100):
        tmp = f'{TEMP_PREFIX}{name}.{secrets.token_hex(6)}'
        try:
            return tmp, os.open(tmp, _NEW_FILE_FLAGS, 0o666, dir_fd=dir_fd)
        except FileExistsError:
            continue
    raise FileExistsError(
        errno.EEXIST, f'no free temporary name for {name!r}', name
    )


def write_at(dir_fd: int, name: str, data: Payload) -> None:
    """Create-exclusive a temporary file, write, fsync, rename to ``name``.

    The folder itself is not synced (callers do, once). A failure leaves
    no temporary file.

    Args:
        dir_fd (int): A descriptor of the folder (:func:`open_folder`).
        name (str): The final file name in it.
        data (bytes | str | Callable): See :func:`write_incident_file`.
    """
    tmp, fd = _new_temp_file(dir_fd, name)
    try:
        try:
            if callable(data):
                with os.fdopen(fd, 'wb', closefd=False) as f:
                    data(f)
            else:
                write_all(
                    fd, data.encode('utf-8') if isinstance(data, str) else data
                )
            os.fsync(fd)
        finally:
            os.close(fd)
        # rename(2) replaces a link at ``name`` itself; it never follows it
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        discard(tmp, dir_fd=dir_fd)
        raise


def write_incident_file(folder: str, name: str, data: Payload) -> str:
    """Write one file into an existing incident folder, complete or not at
    all.

    ``data`` goes to a new temporary file in ``folder`` (created with
    ``O_CREAT | O_EXCL | O_NOFOLLOW``), which is flushed, ``fsync``-ed and
    renamed over ``name`` (:func:`os.replace`); then the folder is synced.
    A link at ``name`` is replaced by the file, not written through
    (``rename(2)`` does not follow the destination); a folder that is a
    link is refused. A failure leaves the old ``name`` (if any) as it was
    and no temporary file.

    Args:
        folder (str): The incident folder.
        name (str): A plain file name, e.g. ``'report.md'``.
        data (bytes | str | Callable): The content; text is written as
            UTF-8; a callable is called with the binary file object to
            write into (``lambda f: torch.save(obj, f)``).

    Returns:
        str: The path written.

    Raises:
        UnsafeIncidentFolderError: ``folder`` is a link or not a folder.
        ValueError: ``name`` is not a plain file name.
        OSError: The write failed (the disk is full, ...).

    Example:
        >>> write_incident_file(folder, 'report.md', '# NanGuard ...')
        >>> write_incident_file(folder, 'model.pth',
        ...                     lambda f: torch.save(state, f))
    """
    _check_name(name)
    path = osp.join(folder, name)
    try:
        dir_fd = open_incident_folder(folder)
        try:
            write_at(dir_fd, name, data)
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as err:  # name the file (a descriptor has no name)
        if err.filename is None:
            err.filename = path
        raise
    return path


def json_bytes(report: Any) -> bytes:
    """``report`` (a dict, or an object with ``to_dict()``) as JSON.

    Raises:
        TypeError: ``report`` is neither.
    """
    if not isinstance(report, dict) and callable(
        getattr(report, 'to_dict', None)
    ):
        report = report.to_dict()
    if not isinstance(report, dict):
        raise TypeError(
            f'nanguard: an incident report is a dict (or has to_dict()); '
            f'got {type(report).__name__}'
        )
    return json.dumps(report, indent=2, default=str).encode('utf-8')


def write_report_json(report: Any, folder: str) -> str:
    """Rewrite ``report.json`` of ``folder`` (see
    :func:`write_incident_file`); return its path.

    Args:
        report (dict | IncidentReport): The report; an object with
            ``to_dict()`` is written as that dict.
        folder (str): The incident folder.
    """
    return write_incident_file(folder, REPORT_NAME, json_bytes(report))


@functools.lru_cache(maxsize=None)
def _renameat2():
    """glibc's ``renameat2``, or None."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        func = libc.renameat2
    except (OSError, AttributeError):
        return None
    func.argtypes = [
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_uint,
    ]
    func.restype = ctypes.c_int
    return func


_RENAME_NOREPLACE = 1


def rename_noreplace(dir_fd: int, src: str, dst: str) -> bool:
    """Rename ``src`` to ``dst`` in ``dir_fd`` unless ``dst`` exists.

    ``renameat2(RENAME_NOREPLACE)`` where the kernel and file system have
    it; otherwise a check, then :func:`os.rename` (which fails on an
    existing non-empty folder, file or link).

    Returns:
        bool: False when ``dst`` exists (nothing was renamed).
    """
    func = _renameat2()
    if func is not None:
        if func(dir_fd, src.encode(), dir_fd, dst.encode(), _RENAME_NOREPLACE):
            code = ctypes.get_errno()
            if code == errno.EEXIST:
                return False
            if code not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
                raise OSError(code, os.strerror(code), dst)
        else:
            return True
    try:
        os.lstat(dst, dir_fd=dir_fd)
        return False
    except FileNotFoundError:
        pass
    try:
        os.rename(src, dst, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError as err:
        if err.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
            return False
        raise
    return True


def make_temp_dir(root_fd: int) -> str:
    """Create ``.tmp_incident_<random>`` in ``root_fd``; return its name."""
    for _ in range(100):
        name = f'{TEMP_DIR_PREFIX}{secrets.token_hex(6)}'
        try:
            os.mkdir(name, 0o777, dir_fd=root_fd)
            return name
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, 'no free temporary folder name')


def remove_temp_dir(root_fd: int, name: str) -> None:
    """Remove the temporary folder ``name`` and the files in it; a
    failure is logged (the error that led here matters more)."""
    try:
        dir_fd = os.open(name, DIR_FLAGS, dir_fd=root_fd)
        try:
            for entry in os.listdir(dir_fd):
                discard(entry, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
        os.rmdir(name, dir_fd=root_fd)
    except OSError as err:
        print_log(
            f'nanguard: could not remove the unfinished incident folder '
            f'{name}: {err}',
            logger='current',
            level=logging.WARNING,
        )
