# Copyright (c) mmnanguard contributors. All rights reserved.
"""Publish a checkpoint that every rank writes a part of so that, after
any crash, it is complete or absent.

The sharding strategies write a checkpoint as a folder that every rank
writes a part of (``FSDPStrategy`` with ``state_dict_cfg='local'``:
``rank<r>.pth``; ``DeepSpeedStrategy``: the model states and one optimizer
partition per rank). Written under its final name, a kill leaves a folder
with some parts missing or cut short, which a resume then takes.

Here the main process makes a private folder next to the final name
(:func:`make_private_folder`: :func:`tempfile.mkdtemp`, mode 0700, named
``.<final name>.<random><TEMP_FOLDER_SUFFIX>``) and tells the other ranks
its name. Every rank writes its parts under the final name inside it
(:func:`written_path`), ``fsync``-s every file there (:func:`sync_tree`),
and, once every rank has, the main process renames it to the final name
and ``fsync``-s the parent folder (:func:`publish`). Something already
under the final name is first renamed aside (a folder) or replaced (a
file or a link, never followed), and removed once the new one is in
place. A kill at any point leaves at most a name ending with
:data:`TEMP_FOLDER_SUFFIX` or :data:`OLD_FOLDER_SUFFIX`, which
:func:`remove_temp_folders` removes at the next start.

Removal never follows a link: :func:`shutil.rmtree` works through folder
descriptors, and a link is unlinked, not followed.
"""

import os
import os.path as osp
import shutil
import stat
import tempfile
from typing import List

from .durable_file import fsync_dir, remove_left_behind

#: The suffix of the private folder a checkpoint's parts are written in.
TEMP_FOLDER_SUFFIX = '.nanguard-tmpdir'
#: The suffix of a replaced checkpoint, until the new one is in place.
OLD_FOLDER_SUFFIX = '.nanguard-olddir'

_READ_FLAGS = (
    os.O_RDONLY | getattr(os, 'O_NOFOLLOW', 0) | getattr(os, 'O_CLOEXEC', 0)
)


def make_private_folder(path: str) -> str:
    """A new private folder next to ``path`` to write its parts in.

    Args:
        path (str): The checkpoint's final name, e.g.
            ``work_dir/iter_4.pth``.

    Returns:
        str: ``work_dir/.iter_4.pth.<random>.nanguard-tmpdir``, made with
        :func:`tempfile.mkdtemp` (mode 0700; it cannot exist before).
    """
    folder, name = osp.split(osp.normpath(path))
    return tempfile.mkdtemp(
        prefix=f'.{name}.', suffix=TEMP_FOLDER_SUFFIX, dir=folder or '.'
    )


def written_path(private: str, path: str) -> str:
    """Where the strategy writes ``path`` inside ``private``."""
    return osp.join(private, osp.basename(osp.normpath(path)))


def _old_path(path: str) -> str:
    folder, name = osp.split(osp.normpath(path))
    return osp.join(folder, f'.{name}{OLD_FOLDER_SUFFIX}')


def _remove_entry(path: str) -> None:
    """Remove ``path``: a folder with everything in it, anything else
    (a link included) by unlinking it; nothing there is no error."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(path)  # through descriptors: no link is followed
    else:
        os.unlink(path)


def _fsync_file(path: str) -> None:
    fd = os.open(path, _READ_FLAGS)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_tree(path: str) -> int:
    """``fsync`` ``path``: a file, or every file in a folder and below,
    then each folder; links are passed over.

    Called by every rank once its parts are written; on one machine each
    file is synced by every rank, which costs little once it is on disk.

    Args:
        path (str): What the strategy wrote (:func:`written_path`).

    Returns:
        int: The number of files synced.

    Raises:
        OSError: A file or folder cannot be synced (the disk failed), or
            nothing was written there.
    """
    if not stat.S_ISDIR(os.lstat(path).st_mode):
        _fsync_file(path)
        fsync_dir(osp.dirname(path))
        return 1
    synced = 0
    for root, _, files in os.walk(path):  # never into a linked folder
        for name in files:
            file = osp.join(root, name)
            if stat.S_ISREG(os.lstat(file).st_mode):
                _fsync_file(file)
                synced += 1
        fsync_dir(root)
    return synced


def publish(private: str, path: str) -> None:
    """Rename the complete :func:`written_path` of ``path`` in ``private``
    to ``path``, ``fsync`` the parent, and remove ``private``.

    A folder already at ``path`` is renamed aside first and removed once
    the new one is in place; a file or a link there is replaced (a link
    is never followed).

    Args:
        private (str): The private folder (:func:`make_private_folder`).
        path (str): The final name.
    """
    old = None
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    written = written_path(private, path)
    if info is not None and stat.S_ISDIR(info.st_mode):
        old = _old_path(path)
        _remove_entry(old)
        os.rename(path, old)
    elif info is not None and osp.isdir(written):
        os.unlink(path)  # a folder cannot be renamed over a file
    os.replace(written, path)
    fsync_dir(osp.dirname(osp.normpath(path)) or '.')
    if old is not None:
        _remove_entry(old)
    _remove_entry(private)


def remove_temp_folders(folder: str) -> List[str]:
    """Remove the private and replaced folders that a killed write left
    directly in ``folder``. Call it only while no other process writes
    into ``folder`` (at the start of a run).

    Args:
        folder (str): A checkpoint folder.

    Returns:
        list[str]: The paths removed.
    """

    def remove(path: str) -> bool:
        _remove_entry(path)
        return True

    return remove_left_behind(
        folder, (TEMP_FOLDER_SUFFIX, OLD_FOLDER_SUFFIX), remove
    )


__all__ = [
    'OLD_FOLDER_SUFFIX',
    'TEMP_FOLDER_SUFFIX',
    'make_private_folder',
    'publish',
    'remove_temp_folders',
    'sync_tree',
    'written_path',
]
