# Copyright (c) mmnanguard contributors. All rights reserved.
"""Publish a folder of files so that, after any crash, it is complete or
absent.

The sharding strategies write a checkpoint as a folder that every rank
writes a part of (``FSDPStrategy`` with ``state_dict_cfg='local'``:
``rank<r>.pth``; ``DeepSpeedStrategy``: the model states and one optimizer
partition per rank). Written under its final name, a kill leaves a folder
with some parts missing or cut short, which a resume then takes.

Here the parts are written into :func:`temp_folder_path` (the same name on
every rank, ``.<final name><TEMP_FOLDER_SUFFIX>``, so that no rank has to
tell the others; what an earlier write left there is removed first:
:func:`remove_temp_folders_of`), every file in it is ``fsync``-ed
(:func:`sync_folder`), and the main process renames it to the final name
(:func:`publish_folder`) once every rank has written, then ``fsync``-s the
parent folder. A folder already under the final name is first renamed
aside and removed after the new one is in place. A kill at any point
leaves at most folders named ``.<name><TEMP_FOLDER_SUFFIX>`` or
``.<name><OLD_FOLDER_SUFFIX>``, which :func:`remove_temp_folders` removes
at the next start.

Removal never follows a link: :func:`shutil.rmtree` works through folder
descriptors, and a link under a temporary name is unlinked, not followed.
"""

import os
import os.path as osp
import shutil
import stat
from typing import List

from .durable_file import fsync_dir, remove_left_behind

#: The suffix of the folder the parts of a checkpoint are written into.
TEMP_FOLDER_SUFFIX = '.nanguard-tmpdir'
#: The suffix of a replaced folder, until the new one is in place.
OLD_FOLDER_SUFFIX = '.nanguard-olddir'

_READ_FLAGS = (
    os.O_RDONLY | getattr(os, 'O_NOFOLLOW', 0) | getattr(os, 'O_CLOEXEC', 0)
)
_DIR_FLAGS = _READ_FLAGS | getattr(os, 'O_DIRECTORY', 0)


def temp_folder_path(path: str) -> str:
    """The folder the parts of ``path`` are written into (the same on
    every rank).

    Args:
        path (str): The final folder, e.g. ``work_dir/iter_4.pth``.

    Returns:
        str: ``work_dir/.iter_4.pth.nanguard-tmpdir``.
    """
    folder, name = osp.split(osp.normpath(path))
    return osp.join(folder, f'.{name}{TEMP_FOLDER_SUFFIX}')


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


def remove_temp_folders_of(path: str) -> None:
    """Remove what a killed write of ``path`` left (its temporary and its
    replaced folder), before any rank writes it again (main process).

    Args:
        path (str): The final folder.
    """
    folder, name = osp.split(osp.normpath(path))
    _remove_entry(temp_folder_path(path))
    _remove_entry(osp.join(folder, f'.{name}{OLD_FOLDER_SUFFIX}'))


def sync_folder(folder: str) -> int:
    """``fsync`` every file in ``folder`` and below, then each folder (or,
    where the strategy wrote one file there, that file).

    Called by every rank once its parts are written; on one machine each
    file is synced by every rank, which costs little once it is on disk.

    Args:
        folder (str): The temporary folder.

    Returns:
        int: The number of files synced.

    Raises:
        OSError: A file or folder cannot be synced (the disk failed).
    """
    if not osp.isdir(folder) or osp.islink(folder):  # one file, or none
        fd = os.open(folder, _READ_FLAGS)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(osp.dirname(osp.normpath(folder)) or '.')
        return 1
    synced = 0
    for root, _, files in os.walk(folder):  # never into a linked folder
        for name in files:
            try:
                fd = os.open(osp.join(root, name), _READ_FLAGS)
            except OSError:  # a link: not a part
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            synced += 1
        fsync_dir(root)
    return synced


def publish_folder(temp: str, path: str) -> None:
    """Rename the complete ``temp`` to ``path`` and ``fsync`` the parent.

    A folder already at ``path`` is renamed aside first and removed once
    the new one is in place; a file or a link there is replaced (a link
    is never followed).

    Args:
        temp (str): The temporary folder, every part written and synced.
        path (str): The final name.
    """
    parent = osp.dirname(osp.normpath(path)) or '.'
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    old = None
    if info is not None and stat.S_ISDIR(info.st_mode):
        folder, name = osp.split(osp.normpath(path))
        old = osp.join(folder, f'.{name}{OLD_FOLDER_SUFFIX}')
        _remove_entry(old)
        os.rename(path, old)
    elif info is not None:
        os.unlink(path)
    os.rename(temp, path)
    fsync_dir(parent)
    if old is not None:
        _remove_entry(old)


def remove_temp_folders(folder: str) -> List[str]:
    """Remove the temporary and replaced folders that a killed write left
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
    'publish_folder',
    'remove_temp_folders',
    'remove_temp_folders_of',
    'sync_folder',
    'temp_folder_path',
]
