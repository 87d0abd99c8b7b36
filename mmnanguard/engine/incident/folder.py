# Copyright (c) mmnanguard contributors. All rights reserved.
"""Incident folders: the one module that writes them and reads them back.

Layout: ``{work_dir}/nanguard/incident_{n:03d}_iter{iteration:06d}`` (with
``_rank{r}`` under DDP, where every rank writes its own folder) holds
``report.json`` and ``batch.pth`` (:class:`IncidentRecorder`, during
training) and, from the diagnosis, ``report.md``, ``timeline.png``,
``config.py`` and ``model.pth`` (:func:`write_incident_file`).

How files are written (a file is complete or absent):

* An incident folder is built under a temporary name
  (``.tmp_incident_<random>``) in ``nanguard/``, every file written into
  it, ``report.json`` last, and only then renamed to its final name. The
  rename never replaces anything: when the name exists the next number is
  taken. A kill leaves either no incident folder or a complete one (and
  perhaps a ``.tmp_incident_*`` folder, which no reader takes for an
  incident).
* Every file is created under a fresh temporary name with
  ``O_CREAT | O_EXCL | O_NOFOLLOW`` (it cannot exist, and a link planted
  under that name is not followed), flushed, ``fsync``-ed and renamed over
  its final name with :func:`os.replace`; then the folder is ``fsync``-ed.
  ``rename(2)`` does not follow a link at the destination: a link named
  ``report.md`` is replaced by the file, never written through.
* The folder itself is opened with ``O_NOFOLLOW | O_DIRECTORY`` and every
  operation is relative to that descriptor, so a folder that is a link is
  refused, and one swapped for a link meanwhile is not followed either.
* Incidents are numbered from what is on disk: one more than the highest
  ``incident_NNN_*`` in ``nanguard/``, whichever rank wrote it (a rank
  whose peer already wrote the same iteration's incident joins its
  number).

How folders are read: an incident folder is data, never code, wherever it
comes from. A folder that is a link or holds a link is refused
(:class:`UnsafeIncidentFolderError`). ``report.json`` must be a regular
file of bounded size holding a JSON object. ``batch.pth`` and
``model.pth`` are loaded with ``torch.load(..., weights_only=True)`` and an
exact allowlist (:func:`incident_batch_globals`), in scope for that one
load only: the data classes a batch holds (the mmdet/mmrotate/mmseg data
samples, ``InstanceData``, ``PixelData``, the box and mask types) and what
numpy arrays pickle to; tensors, dicts, lists and tuples are torch's own
defaults. A file that needs anything else is refused with
:class:`UntrustedIncidentError`, naming the file and the global or the
call; nothing from it runs. Every error names the file.

The folder-name and ``report.json`` checks of :func:`load_incident` are a
consistency check (is this what ``NanGuardHook`` wrote, of the same
iteration?), not protection: whoever crafts a folder writes those too.
"""

import ctypes
import errno
import functools
import importlib
import json
import logging
import os
import os.path as osp
import pickle
import re
import secrets
import stat
import zipfile
from typing import Any, BinaryIO, Callable, Dict, List, Optional, Tuple, Union

import torch
from mmengine.logging import print_log

from mmnanguard.compat.checkpoint_allowlist import numpy_globals
from mmnanguard.compat.safe_load import (
    UntrustedFileError,
    globals_outside,
    scoped_safe_globals,
    weights_only_load,
)

from .kinds import IncidentKind

REPORT_NAME = 'report.json'
BATCH_NAME = 'batch.pth'
MODEL_NAME = 'model.pth'
CONFIG_NAME = 'config.py'
#: Written into a folder whose incident a resume discarded.
DISCARDED_NAME = 'DISCARDED'
#: ``incident_NNN_iterNNNNNN[_rankR]``: number, iteration, rank.
INCIDENT_DIR_RE = re.compile(
    r'^incident_(\d{3,})_iter(\d{6,})(?:_rank(\d+))?$'
)
#: Temporary files and folders start with it (hidden, never ``incident_``).
TEMP_PREFIX = '.tmp_'
TEMP_DIR_PREFIX = TEMP_PREFIX + 'incident_'
#: ``report.json`` larger than this is refused (a real one is kilobytes).
MAX_REPORT_BYTES = 64 * 1024 * 1024
#: The data classes a ``batch.pth`` may hold, by module. A package that is
#: not installed contributes none (its classes cannot be in a batch here).
BATCH_CLASSES = (
    ('mmengine.structures', ('InstanceData', 'PixelData')),
    ('mmdet.structures', ('DetDataSample',)),
    ('mmdet.structures.bbox', ('HorizontalBoxes',)),
    ('mmdet.structures.mask', ('BitmapMasks', 'PolygonMasks')),
    ('mmrotate.structures.bbox', ('RotatedBoxes', 'QuadriBoxes')),
    ('mmseg.structures', ('SegDataSample',)),
)
_DIR_FLAGS = (
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
_READ_FLAGS = (
    os.O_RDONLY
    | getattr(os, 'O_NOFOLLOW', 0)
    | getattr(os, 'O_NONBLOCK', 0)  # a FIFO must not block the open
    | getattr(os, 'O_CLOEXEC', 0)
)
#: What :func:`write_incident_file` writes: bytes, text (UTF-8), or a
#: function that writes into the binary file object it is given.
Payload = Union[bytes, str, Callable[[BinaryIO], Any]]


class NotAnIncidentError(ValueError):
    """A folder or file is not what ``NanGuardHook`` writes."""


class UntrustedIncidentError(NotAnIncidentError, UntrustedFileError):
    """An incident file holds objects or calls outside the allowlist."""


class UnsafeIncidentFolderError(NotAnIncidentError):
    """An incident folder is a link, holds one, or is not a folder."""


# -- writing ---------------------------------------------------------------


def _describe_entry(path: str) -> str:
    """What ``path`` is, without following it."""
    try:
        mode = os.lstat(path).st_mode
    except OSError as err:
        return f'unreadable ({err.strerror})'
    if stat.S_ISLNK(mode):
        try:
            return f'a symbolic link to {os.readlink(path)!r}'
        except OSError:
            return 'a symbolic link'
    return 'not a folder'


def _open_folder(folder: str) -> int:
    """A descriptor of ``folder``, which must be a real folder, not a link.

    Raises:
        UnsafeIncidentFolderError: ``folder`` is a link or not a folder.
        OSError: It cannot be opened (it does not exist, permissions).
    """
    try:
        return os.open(folder, _DIR_FLAGS)
    except OSError as err:
        if err.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
    raise UnsafeIncidentFolderError(
        f'nanguard: refusing to write into {folder!r}: it is '
        f'{_describe_entry(folder)}; expected a real folder (incident '
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


def _unlink_quietly(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


def _write_at(dir_fd: int, name: str, data: Payload) -> None:
    """Create-exclusive a temporary file, write, fsync, rename to ``name``.

    The folder itself is not synced (callers do, once).
    """
    tmp, fd = _new_temp_file(dir_fd, name)
    done = False
    try:
        with os.fdopen(fd, 'wb') as f:
            if callable(data):
                data(f)
            else:
                f.write(
                    data.encode('utf-8') if isinstance(data, str) else data
                )
            f.flush()
            os.fsync(f.fileno())
        # rename(2) replaces a link at ``name`` itself; it never follows it
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        done = True
    finally:
        if not done:
            _unlink_quietly(tmp, dir_fd)


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
        dir_fd = _open_folder(folder)
        try:
            _write_at(dir_fd, name, data)
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as err:  # name the file (a descriptor has no name)
        if err.filename is None:
            err.filename = path
        raise
    return path


def _json_bytes(report: Any) -> bytes:
    """``report`` (a dict, or an object with ``to_dict()``) as JSON."""
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
    return write_incident_file(folder, REPORT_NAME, _json_bytes(report))


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


def _rename_noreplace(dir_fd: int, src: str, dst: str) -> bool:
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


def _remove_temp_dir(root_fd: int, name: str) -> None:
    """Remove the temporary folder ``name`` and the files in it; a
    failure is logged (the error that led here matters more)."""
    try:
        dir_fd = os.open(name, _DIR_FLAGS, dir_fd=root_fd)
        try:
            for entry in os.listdir(dir_fd):
                _unlink_quietly(entry, dir_fd)
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


def parse_folder_name(name: str) -> Optional[Tuple[int, int, Optional[int]]]:
    """``(number, iteration, rank)`` of an incident folder name, or None.

    Args:
        name (str): A base name, e.g. ``'incident_003_iter000012_rank1'``.

    Returns:
        tuple | None: ``rank`` is None without a ``_rank`` suffix.
    """
    match = INCIDENT_DIR_RE.match(name)
    if match is None:
        return None
    rank = match.group(3)
    return (
        int(match.group(1)),
        int(match.group(2)),
        None if rank is None else int(rank),
    )


class IncidentRecorder:
    """Writes one folder per incident: ``report.json`` and ``batch.pth``.

    Folder names are ``incident_{n:03d}_iter{iteration:06d}`` (with
    ``_rank{r}`` under DDP, where every rank writes its own), ``n``
    numbered from the folders on disk. See the module docstring for how
    a folder is built, named and renamed into place.

    Args:
        work_dir (str): The runner's work dir; folders go to
            ``{work_dir}/nanguard``.
        max_incidents (int): Folders this rank writes at most (its
            folders already on disk count).
        rank (int): This process' rank.
        world_size (int): Number of processes.
    """

    def __init__(
        self, work_dir: str, max_incidents: int, rank: int, world_size: int
    ) -> None:
        self.root = osp.join(work_dir, 'nanguard')
        self.max_incidents = max_incidents
        self.rank = rank
        self.world_size = world_size
        self.written = len(self.own_folders())

    def _suffix_rank(self) -> Optional[int]:
        return self.rank if self.world_size > 1 else None

    def _parsed(self) -> List[Tuple[int, int, Optional[int]]]:
        try:
            names = os.listdir(self.root)
        except (FileNotFoundError, NotADirectoryError):
            return []
        return [p for p in map(parse_folder_name, names) if p is not None]

    def own_folders(self) -> List[str]:
        """The incident folders of this rank in :attr:`root`, by name."""
        mine = self._suffix_rank()
        return sorted(
            self.folder_name(n, it)
            for n, it, rank in self._parsed()
            if rank == mine
        )

    def folder_name(self, number: int, iteration: int) -> str:
        """``incident_{number:03d}_iter{iteration:06d}[_rank{r}]``."""
        name = f'incident_{number:03d}_iter{iteration:06d}'
        if self.world_size > 1:
            name += f'_rank{self.rank}'
        return name

    def next_number(self, iteration: int) -> int:
        """The number of this rank's next incident at ``iteration``.

        One more than the highest number on disk (0 on an empty disk),
        except that a peer rank's folder of the same iteration, numbered
        above every folder of this rank, gives its number: the ranks'
        folders of one incident share it.
        """
        parsed = self._parsed()
        mine = self._suffix_rank()
        top_mine = max((n for n, _, r in parsed if r == mine), default=-1)
        peers = sorted(
            n
            for n, it, r in parsed
            if it == iteration and r != mine and n > top_mine
        )
        if peers:
            return peers[0]
        return max((n for n, _, _ in parsed), default=-1) + 1

    def record(
        self,
        report: Dict[str, Any],
        batch: Optional[Dict[str, Any]] = None,
        *,
        force: bool = False,
    ) -> Optional[str]:
        """Write the incident; return its folder, or None.

        Never raises into training: a failure to write (a full disk, a
        batch ``torch.save`` cannot pickle, a link where the folder should
        be) is logged as an error naming the folder and the error, the
        temporary folder is removed, ``report['write_error']`` says why,
        and None is returned.

        Args:
            report (dict): JSON-serializable report with an integer
                ``iteration``; ``report_path`` is set to the final
                ``report.json`` (removed again when nothing was written).
            batch (dict, optional): Written to ``batch.pth`` when given
                (the data batch and the RNG states).
            force (bool): Write even when ``max_incidents`` folders exist
                (the incident that stops training). Defaults to False.

        Returns:
            str | None: The folder; None when ``max_incidents`` folders
            exist already (and not ``force``) or the write failed.
        """
        iteration = report['iteration']
        if self.written >= self.max_incidents and not force:
            print_log(
                f'nanguard: the incident of iteration {iteration} is not '
                f'written: max_incidents={self.max_incidents} folders of '
                f'this rank exist in {self.root}',
                logger='current',
                level=logging.WARNING,
            )
            return None
        target = [osp.join(self.root, self.folder_name(0, iteration))]
        try:
            folder = self._write(report, batch, target)
        except Exception as err:  # noqa: BLE001  (logged; never stops a run)
            message = (
                f'nanguard: could not write the incident folder '
                f'{target[0]}: {type(err).__name__}: {err}. Training goes '
                'on; this incident has no folder.'
            )
            report.pop('report_path', None)
            report['write_error'] = message
            print_log(message, logger='current', level=logging.ERROR)
            return None
        self.written += 1
        if batch is not None:
            _warn_if_refused(osp.join(folder, BATCH_NAME))
        return folder

    def _write(
        self,
        report: Dict[str, Any],
        batch: Optional[Dict[str, Any]],
        target: List[str],
    ) -> str:
        """Build the folder under a temporary name, rename it into place.

        ``target[0]`` is kept up to date with the folder being written,
        for the error message.
        """
        os.makedirs(self.root, exist_ok=True)
        root_fd = _open_folder(self.root)
        try:
            tmp = _make_temp_dir(root_fd)
            target[0] = osp.join(self.root, tmp)
            try:
                name = self._fill_and_rename(root_fd, tmp, report, batch)
            except BaseException:
                _remove_temp_dir(root_fd, tmp)
                raise
            os.fsync(root_fd)
        finally:
            os.close(root_fd)
        return osp.join(self.root, name)

    def _fill_and_rename(
        self,
        root_fd: int,
        tmp: str,
        report: Dict[str, Any],
        batch: Optional[Dict[str, Any]],
    ) -> str:
        iteration = report['iteration']
        dir_fd = os.open(tmp, _DIR_FLAGS, dir_fd=root_fd)
        try:
            if batch is not None:
                _write_at(dir_fd, BATCH_NAME, lambda f: torch.save(batch, f))
            number = self.next_number(iteration)
            for _ in range(1000):
                name = self.folder_name(number, iteration)
                report['report_path'] = osp.join(self.root, name, REPORT_NAME)
                _write_at(dir_fd, REPORT_NAME, _json_bytes(report))
                os.fsync(dir_fd)
                if _rename_noreplace(root_fd, tmp, name):
                    return name
                number = max(number + 1, self.next_number(iteration))
        finally:
            os.close(dir_fd)
        raise FileExistsError(
            errno.EEXIST,
            'no free incident folder name after 1000 tries',
            self.root,
        )


def _make_temp_dir(root_fd: int) -> str:
    """Create ``.tmp_incident_<random>`` in ``root_fd``; return its name."""
    for _ in range(100):
        name = f'{TEMP_DIR_PREFIX}{secrets.token_hex(6)}'
        try:
            os.mkdir(name, 0o777, dir_fd=root_fd)
            return name
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, 'no free temporary folder name')


def mark_discarded(root: str, after_iteration: int) -> List[str]:
    """Mark the incident folders that a resume discarded.

    A run resumed from a checkpoint repeats (or never reaches again) the
    iterations after it: their incidents describe a part of the run that
    no longer exists. Each such folder gets a ``DISCARDED`` file and
    ``"discarded_by_resume": true`` (with ``resumed_at_iteration``) in its
    ``report.json``, both written with :func:`write_incident_file`.
    Folders that are links, and folders already marked, are left alone; a
    folder whose ``report.json`` cannot be read or written still gets the
    ``DISCARDED`` file (the failure is logged).

    Args:
        root (str): ``{work_dir}/nanguard``.
        after_iteration (int): The iterations the checkpoint completed
            (``checkpoint['meta']['iter']``, the ``runner.iter`` the
            resumed run starts at). An incident whose 0-based
            ``iteration`` is this or later happened after the checkpoint.

    Returns:
        list[str]: The folders marked now, sorted.
    """
    try:
        names = sorted(os.listdir(root))
    except (FileNotFoundError, NotADirectoryError):
        return []
    marked = []
    for name in names:
        parsed = parse_folder_name(name)
        folder = osp.join(root, name)
        if (
            parsed is None
            or parsed[1] < after_iteration
            or osp.islink(folder)
            or osp.lexists(osp.join(folder, DISCARDED_NAME))
        ):
            continue
        note = (
            f'The run was resumed from a checkpoint of iteration '
            f'{after_iteration}; this incident (iteration {parsed[1]}) '
            'happened after it, in a part of the run the resume '
            'discarded.\n'
        )
        try:
            write_incident_file(folder, DISCARDED_NAME, note)
        except (OSError, ValueError) as err:
            print_log(
                f'nanguard: could not mark {folder} as discarded by the '
                f'resume: {type(err).__name__}: {err}',
                logger='current',
                level=logging.ERROR,
            )
            continue
        marked.append(folder)
        try:
            report = load_report(folder)
            report['discarded_by_resume'] = True
            report['resumed_at_iteration'] = after_iteration
            write_report_json(report, folder)
        except (OSError, ValueError) as err:
            print_log(
                f'nanguard: {folder} is marked DISCARDED, but its '
                f'{REPORT_NAME} was not updated: {err}',
                logger='current',
                level=logging.WARNING,
            )
    return marked


# -- reading ---------------------------------------------------------------


def linked_entries(folder: str) -> List[str]:
    """The paths in ``folder`` (the folder itself included) that are links.

    Args:
        folder (str): A folder.

    Returns:
        list[str]: The links, sorted; ``[]`` when there is none.
    """
    if osp.islink(folder):
        return [folder]
    try:
        with os.scandir(folder) as entries:
            return sorted(e.path for e in entries if e.is_symlink())
    except (FileNotFoundError, NotADirectoryError):
        return []


def refuse_links(folder: str) -> None:
    """Raise when ``folder`` is a link or holds one.

    Raises:
        UnsafeIncidentFolderError: Naming the first link and its target.
    """
    links = linked_entries(folder)
    if links:
        raise UnsafeIncidentFolderError(
            f'nanguard: refusing the incident folder {folder}: '
            f'{links[0]} is {_describe_entry(links[0])} '
            f'({len(links)} link(s) in all). NanGuardHook writes no links; '
            'an incident folder that holds one is not read, and nothing '
            'is written through it'
        )


def _read_regular(path: str, limit: int) -> bytes:
    """The bytes of ``path``, a regular file (not a link) of at most
    ``limit`` bytes.

    Raises:
        NotAnIncidentError: It is a link, not a regular file, larger than
            ``limit``, or unreadable; naming the file.
    """
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise UnsafeIncidentFolderError(
                f'nanguard: refusing {path}: it is '
                f'{_describe_entry(path)}; expected a regular file'
            ) from err
        raise NotAnIncidentError(
            f'nanguard: cannot read {path}: {err.strerror or err}'
        ) from err
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotAnIncidentError(
                f'nanguard: refusing {path}: it is not a regular file '
                f'(mode {stat.filemode(info.st_mode)})'
            )
        if info.st_size > limit:
            raise NotAnIncidentError(
                f'nanguard: refusing {path}: {info.st_size} bytes, more '
                f'than the {limit} an incident report may have'
            )
        with os.fdopen(os.dup(fd), 'rb') as f:
            data = f.read(limit + 1)
    except OSError as err:
        raise NotAnIncidentError(
            f'nanguard: cannot read {path}: {err.strerror or err}'
        ) from err
    finally:
        os.close(fd)
    if len(data) > limit:
        raise NotAnIncidentError(
            f'nanguard: refusing {path}: more than {limit} bytes'
        )
    return data


def load_report(folder: str) -> Dict[str, Any]:
    """``report.json`` of an incident folder, as a dict.

    Args:
        folder (str): The incident folder.

    Returns:
        dict: The report (not checked beyond being a JSON object; see
        :func:`check_report`).

    Raises:
        NotAnIncidentError: The file is missing, a link, not a regular
            file, too large, not JSON, nested too deep or not an object;
            the message names it.
    """
    path = osp.join(folder, REPORT_NAME)
    data = _read_regular(path, MAX_REPORT_BYTES)
    try:
        report = json.loads(data.decode('utf-8'))
    except ValueError as err:  # json.JSONDecodeError, UnicodeDecodeError
        raise NotAnIncidentError(
            f'{path} is not an incident report: not JSON ({err})'
        ) from err
    except RecursionError as err:
        raise NotAnIncidentError(
            f'{path} is not an incident report: it is nested deeper than '
            'the JSON reader allows (an incident report is a few levels '
            'deep)'
        ) from err
    if not isinstance(report, dict):
        raise NotAnIncidentError(
            f'{path} is not an incident report: expected a JSON '
            f'object, got {type(report).__name__}'
        )
    return report


#: Optional report fields read as data by the diagnosis, and their types.
_FIELD_TYPES = {
    'epoch': (int, type(None)),
    'rank': (int, type(None)),
    'action': (str, type(None)),
    'loss_scale': (int, float, type(None)),
    'lr': (int, float, str, dict, type(None)),
    'grad_norm': (int, float, str, type(None)),
    'nonfinite_terms': (dict,),
    'history': (list,),
    'samples': (list,),
    'live': (dict, type(None)),
    'stage': (str, type(None)),
}


#: A report nested deeper than this is refused (a real one has about 6).
MAX_REPORT_DEPTH = 32


def _depth(value: Any) -> int:
    """Nesting depth of lists and dicts in ``value`` (iterative)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, depth)
            if depth <= MAX_REPORT_DEPTH:
                stack.extend((v, depth + 1) for v in item)
    return deepest


def check_report(report: Dict[str, Any], path: str) -> None:
    """Check that ``report`` is what ``NanGuardHook`` writes.

    Every :class:`IncidentKind` is accepted; ``iteration`` must be an
    integer, the fields the diagnosis reads have their types, and the
    report is nested at most :data:`MAX_REPORT_DEPTH` deep.

    Raises:
        NotAnIncidentError: Naming the file, the field, its value and the
            expected form.
    """
    if _depth(report) > MAX_REPORT_DEPTH:
        raise NotAnIncidentError(
            f'{path} is not an incident report: it is nested more than '
            f'{MAX_REPORT_DEPTH} levels deep (an incident report has a few)'
        )
    kind = IncidentKind.parse(report.get('kind'))
    iteration = report.get('iteration')
    if (
        kind is None
        or not isinstance(iteration, int)
        or isinstance(iteration, bool)
    ):
        kinds = tuple(k.value for k in IncidentKind)
        raise NotAnIncidentError(
            f'{path} is not an incident report: kind='
            f'{report.get("kind")!r}, expected one of {kinds}, '
            f'and an integer iteration (got {iteration!r})'
        )
    for key, types in _FIELD_TYPES.items():
        if key in report and not isinstance(report[key], types):
            names = ' or '.join(t.__name__ for t in types)
            raise NotAnIncidentError(
                f'{path} is not an incident report: {key}='
                f'{_short(report[key])} is of type '
                f'{type(report[key]).__name__}; expected {names}'
            )
    for key in ('history', 'samples'):
        for entry in report.get(key, []):
            if not isinstance(entry, dict) or (
                key == 'history'
                and not isinstance(entry.get('iteration'), int)
            ):
                raise NotAnIncidentError(
                    f'{path} is not an incident report: an entry of {key} '
                    f'is {_short(entry)}; expected an object'
                    + (
                        ' with an integer iteration'
                        if key == 'history'
                        else ''
                    )
                )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + '...'


def incident_batch_globals() -> List[Any]:
    """The allowlist of ``batch.pth``: data classes and numpy, no callable.

    Returns:
        list: Entries for ``torch.serialization.safe_globals``.
    """
    found: List[Any] = []
    for module_name, names in BATCH_CLASSES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        found += [getattr(module, name) for name in names]
    return found + numpy_globals()


def check_batch_globals(path: str) -> List[str]:
    """The globals of ``path`` outside :func:`incident_batch_globals`.

    Read without unpickling. A legacy-format file cannot be scanned this
    way; the load itself refuses what it holds.

    Args:
        path (str): A ``batch.pth``.

    Returns:
        list[str]: ``[]`` (raises otherwise).

    Raises:
        UntrustedIncidentError: Naming the file and the foreign globals.
    """
    with scoped_safe_globals(incident_batch_globals()):
        foreign = globals_outside(path)
    if foreign:
        raise UntrustedIncidentError(
            f'Refusing to load the incident batch {path!r}: it references '
            f'globals outside the allowlist: {foreign}'
        )
    return foreign


def replay_refusal(batch_path: str) -> Optional[str]:
    """Why offline replay would refuse ``batch_path``, or None.

    ``batch.pth`` is read back with ``weights_only=True`` and an allowlist
    of data classes; a batch holding anything else (say, a custom object
    in a dataset's metainfo) is refused. This says so when the file is
    written, not when someone replays it.

    Args:
        batch_path (str): A ``batch.pth`` just written.

    Returns:
        str | None: The refusal, naming the file and the globals outside
        the allowlist; None when replay will load the file.
    """
    try:
        check_batch_globals(batch_path)
    except UntrustedIncidentError as err:
        return str(err)
    return None


def _warn_if_refused(batch_path: str) -> None:
    refusal = replay_refusal(batch_path)
    if refusal is not None:
        print_log(
            'nanguard: offline replay (tools/replay.py, load_incident) '
            f'will refuse this incident batch. {refusal}',
            logger='current',
            level=logging.WARNING,
        )


def _load_data_file(
    path: str, entries: List[Any], what: str, error: type
) -> Any:
    """``weights_only`` load of an incident file; every error names it."""
    try:
        return weights_only_load(
            path, entries, what=what, error=error, map_location='cpu'
        )
    except UntrustedFileError:
        raise
    except (
        RuntimeError,
        EOFError,
        OSError,
        ValueError,
        pickle.UnpicklingError,
        zipfile.BadZipFile,
    ) as err:
        raise NotAnIncidentError(
            f'nanguard: cannot load the {what} {path}: it is not a '
            f'complete torch file (truncated by a kill or a full disk, or '
            f'not written by NanGuard): {type(err).__name__}: {err}'
        ) from err
    except RecursionError as err:
        raise NotAnIncidentError(
            f'nanguard: cannot load the {what} {path}: it is nested '
            'deeper than Python can unpickle'
        ) from err


#: ``BaseDataElement`` attributes that are state, not fields.
_ELEMENT_STATE = frozenset(('_metainfo_fields', '_data_fields'))


def check_data_elements(batch: Any, path: str) -> None:
    """Refuse a data element whose fields shadow its class's attributes.

    A pickled ``DetDataSample`` (or any ``BaseDataElement``) is restored
    by setting its ``__dict__``: a field named ``to`` or ``keys`` would
    replace the method for that object, and the replay would fail far
    from the file with a ``TypeError``.

    Args:
        batch: The loaded ``batch.pth``.
        path (str): Its path, for the message.

    Raises:
        NotAnIncidentError: Naming the file, the class and the field.
    """
    from mmengine.structures import BaseDataElement

    stack, seen = [batch], 0
    while stack:
        obj = stack.pop()
        seen += 1
        if seen > 1_000_000:
            raise NotAnIncidentError(
                f'nanguard: {path} holds more than a million objects; an '
                'incident batch holds one batch'
            )
        if isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
        elif isinstance(obj, BaseDataElement):
            cls = type(obj)
            for key, value in vars(obj).items():
                if key not in _ELEMENT_STATE and hasattr(cls, key):
                    raise NotAnIncidentError(
                        f'nanguard: refusing {path}: a {cls.__name__} in it '
                        f'has a field {key!r} that shadows '
                        f'{cls.__name__}.{key}; expected data fields only'
                    )
                stack.append(value)


def load_batch(path: str) -> Dict[str, Any]:
    """Load ``batch.pth`` with ``weights_only=True`` and the allowlist.

    Args:
        path (str): The file.

    Returns:
        dict: What the file holds (checked by :func:`load_incident`).

    Raises:
        UntrustedIncidentError: The unpickler refused a global or a call;
            the message names the file and it.
        NotAnIncidentError: The file is truncated or not a torch file, or
            a data element in it shadows its class; naming the file.
    """
    batch = _load_data_file(
        path,
        incident_batch_globals(),
        'incident batch',
        UntrustedIncidentError,
    )
    check_data_elements(batch, path)
    return batch


def load_model_state(path: str) -> Dict[str, torch.Tensor]:
    """``model.pth``: a plain state dict, loaded as data only.

    Args:
        path (str): The file.

    Returns:
        dict: Parameter and buffer names to tensors.

    Raises:
        FileNotFoundError: There is no such file.
        UntrustedIncidentError: It holds anything beyond tensors in dicts.
        NotAnIncidentError: It is a link, truncated, or not a dict of
            tensors; naming the file.
    """
    if osp.islink(path):
        raise UnsafeIncidentFolderError(
            f'nanguard: refusing {path}: it is {_describe_entry(path)}'
        )
    if not osp.isfile(path):
        raise FileNotFoundError(
            f'{path} does not exist (NanDiagnosisHook(save_model=True) '
            'writes it): pass --checkpoint CKPT'
        )
    state = _load_data_file(path, [], 'model state', UntrustedIncidentError)
    if not isinstance(state, dict) or not all(
        isinstance(v, torch.Tensor) for v in state.values()
    ):
        raise NotAnIncidentError(
            f'{path} is not a model state dict: expected a dict of '
            'tensors (what NanDiagnosisHook writes)'
        )
    return state


def _leftovers(folder: str) -> List[str]:
    """Temporary files an interrupted write left in ``folder``."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return sorted(
        n for n in names if n.startswith(TEMP_PREFIX) or n.endswith('.tmp')
    )


def _missing(folder: str, name: str, hint: str) -> NotAnIncidentError:
    leftovers = _leftovers(folder)
    if leftovers:
        return NotAnIncidentError(
            f'nanguard: {folder} has no {name}, only the unfinished '
            f'temporary file(s) {leftovers}: writing this incident was '
            'interrupted (a kill, a crash or a full disk) before it was '
            'complete; the folder holds no usable incident'
        )
    return NotAnIncidentError(f'{folder} has no {name} ({hint})')


def load_incident(folder: str) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """``(report, batch)`` of an incident folder, checked before loading.

    Args:
        folder (str): ``.../nanguard/incident_000_iter000012``.

    Returns:
        tuple: The ``report.json`` content and the ``batch.pth`` dict
        (``data_batch``, ``rng_state``, ``iteration``).

    Raises:
        UnsafeIncidentFolderError: The folder is a link or holds one.
        NotAnIncidentError: If the folder name, the report or the batch
            file is not an incident's (a consistency check), or a file is
            truncated; the message names the file.
        UntrustedIncidentError: If ``batch.pth`` holds anything outside
            the allowlist (:func:`incident_batch_globals`).
    """
    folder = osp.abspath(folder)
    name = osp.basename(folder)
    refuse_links(folder)
    if name.startswith(TEMP_DIR_PREFIX):
        raise NotAnIncidentError(
            f'nanguard: {folder} is an unfinished incident folder: writing '
            'it was interrupted (a kill, a crash or a full disk) before it '
            'was complete and renamed; it holds no usable incident'
        )
    if not INCIDENT_DIR_RE.match(name):
        raise NotAnIncidentError(
            f'{folder} is not an incident folder: expected a name like '
            "'incident_000_iter000012' (written by NanGuardHook)"
        )
    if not osp.isdir(folder):
        raise NotAnIncidentError(f'{folder} is not a folder')
    report_path = osp.join(folder, REPORT_NAME)
    batch_path = osp.join(folder, BATCH_NAME)
    if not osp.lexists(report_path):
        raise _missing(folder, REPORT_NAME, 'NanGuardHook writes it')
    report = load_report(folder)
    check_report(report, report_path)
    if not osp.lexists(batch_path):
        raise _missing(
            folder, BATCH_NAME, 'NanGuardHook(save_batch=True) writes it'
        )
    batch = load_batch(batch_path)
    if not isinstance(batch, dict) or not {
        'data_batch',
        'rng_state',
        'iteration',
    } <= set(batch):
        raise NotAnIncidentError(
            f'{batch_path} is not an incident batch: expected a dict with '
            'data_batch, rng_state and iteration'
        )
    if batch['iteration'] != report['iteration']:
        raise NotAnIncidentError(
            f"{batch_path} is of iteration {batch['iteration']!r}, its "
            f"report of iteration {report['iteration']}"
        )
    return report, batch


__all__ = [
    'BATCH_NAME',
    'CONFIG_NAME',
    'DISCARDED_NAME',
    'INCIDENT_DIR_RE',
    'MODEL_NAME',
    'REPORT_NAME',
    'IncidentRecorder',
    'NotAnIncidentError',
    'UnsafeIncidentFolderError',
    'UntrustedIncidentError',
    'check_batch_globals',
    'check_data_elements',
    'check_report',
    'incident_batch_globals',
    'linked_entries',
    'load_batch',
    'load_incident',
    'load_model_state',
    'load_report',
    'mark_discarded',
    'parse_folder_name',
    'refuse_links',
    'replay_refusal',
    'write_incident_file',
    'write_report_json',
]
