# Copyright (c) mmnanguard contributors. All rights reserved.
"""The one way a protected run removes a checkpoint.

mmengine 0.10.7's ``CheckpointHook`` removes files in three places, each
through its file backend and each from a path it got from the message
hub, which a resume fills from the checkpoint: ``before_train`` (the
``keep_ckpt_ids`` beyond ``max_keep_ckpts``), ``_save_checkpoint_with_step``
(the rotation) and ``_save_best_checkpoint`` (the previous best). Each
removes a file, or with ``rmtree`` a whole folder (DeepSpeed checkpoints
are folders), and follows links on the way. A crafted checkpoint thereby
deleted any file (``best_ckpt``) or folder (``keep_ckpt_ids``) it named.

:func:`remove_checkpoint_file` removes only a checkpoint of a name the
hook writes, directly in the checkpoint folder: it opens the folder, looks
at the name there without following a link, and unlinks it through the
folder's descriptor (``unlink`` removes a link itself, never its target).
A checkpoint folder (DeepSpeed, FSDP's local state dicts) is removed only
when it is one: a real folder (opened without following a link) holding
nothing but regular files; each is unlinked through the folder's own
descriptor, then the empty folder is removed. Anything else (a link, a
nested folder, a device) keeps the folder, with a warning.
:class:`CheckpointRemovalBackend` is the hook's file backend with
``remove`` and ``rmtree`` going through it;
:class:`~.durable_checkpoint_hook.DurableCheckpointHook` installs it (and
trims the resumed ``keep_ckpt_ids`` through it), so all three removals go
through this one function. For a remote checkpoint folder (``s3://...``)
the name and folder are checked on the path and the backend removes the
file; a remote folder is kept.
"""

import logging
import os
import os.path as osp
import re
import stat
import string
from typing import Any, Optional, Pattern

from mmengine.logging import print_log

from mmnanguard.fileio.checkpoint_verify import is_local_path

#: What :func:`remove_checkpoint_file` says of a file that is not there.
MISSING = 'it does not exist'


def numbered_name(filename_tmpl: str) -> str:
    """The regular expression of the names ``filename_tmpl`` gives a
    number (``'iter_{}.pth'`` -> ``r'iter_\\d+\\.pth'``).

    Args:
        filename_tmpl (str): A ``CheckpointHook``'s ``filename_tmpl``.

    Returns:
        str: The expression (not anchored); the literal name when the
        template has no field.
    """
    parts = []
    for literal, field, _, _ in string.Formatter().parse(filename_tmpl):
        parts.append(re.escape(literal))
        if field is not None:
            parts.append(r'\d+')
    return ''.join(parts)


def checkpoint_names(filename_tmpl: str) -> Pattern:
    """The names a ``CheckpointHook`` with ``filename_tmpl`` (and the
    preemption save) writes: ``filename_tmpl`` of a number,
    ``iter_<n>.pth``, ``epoch_<n>.pth``, each optionally after
    ``best_<metric>_`` (the ``save_best`` copies).

    Args:
        filename_tmpl (str): The hook's ``filename_tmpl``.

    Returns:
        Pattern: To ``fullmatch`` a file name.
    """
    numbered = numbered_name(filename_tmpl)
    return re.compile(
        rf'(?:best_[^/\\]+_)?(?:{numbered}|(?:iter|epoch)_\d+\.pth)'
    )


def inside_folder(path: str, folder: str) -> bool:
    """Whether ``path`` names an entry directly in ``folder``, links in
    ``path``'s folder part resolved (a remote path: by its text)."""
    if not is_local_path(folder):
        return osp.dirname(path) == folder.rstrip('/')
    parent = osp.dirname(osp.abspath(path))
    return osp.realpath(parent) == osp.realpath(folder)


def remove_checkpoint_file(
    folder: str, path: str, names: Pattern
) -> Optional[str]:
    """Remove ``path`` if it is a regular file, or a folder of regular
    files (a sharded checkpoint), named like ``names`` directly in
    ``folder``; never follow a link.

    Args:
        folder (str): The checkpoint folder (the hook's ``out_dir``).
        path (str): The file or checkpoint folder to remove.
        names (Pattern): The names that may be removed
            (:func:`checkpoint_names`).

    Returns:
        str | None: None when removed; else why it was kept, a phrase to
        follow the path (:data:`MISSING` when it is not there).
    """
    name = osp.basename(str(path))
    if not names.fullmatch(name):
        return (
            'its name is not one a CheckpointHook writes ' f'({names.pattern})'
        )
    if not inside_folder(str(path), str(folder)):
        return f'it is not directly in the checkpoint folder {folder!r}'
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as err:
        return f'the checkpoint folder cannot be opened ({err.strerror})'
    try:
        info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if stat.S_ISDIR(info.st_mode):
            return _remove_checkpoint_folder(fd, name)
        if not stat.S_ISREG(info.st_mode):
            return 'it is not a regular file or a checkpoint folder (a link)'
        os.unlink(name, dir_fd=fd)
    except FileNotFoundError:
        return MISSING
    except OSError as err:
        return f'it cannot be removed ({err.strerror})'
    finally:
        os.close(fd)
    return None


def _remove_checkpoint_folder(parent_fd: int, name: str) -> Optional[str]:
    """Remove the checkpoint folder ``name`` of the folder open as
    ``parent_fd``: its regular files, then itself; nothing when it holds
    anything else. Raises ``OSError`` as ``os`` does."""
    fd = os.open(
        name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent_fd
    )
    try:
        entries = os.listdir(fd)
        for entry in entries:
            mode = os.stat(entry, dir_fd=fd, follow_symlinks=False).st_mode
            if not stat.S_ISREG(mode):
                return (
                    f'it is a folder whose entry {entry!r} is not a regular '
                    "file (a checkpoint folder holds only the ranks' files)"
                )
        for entry in entries:
            os.unlink(entry, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent_fd)
    return None


class CheckpointRemovalBackend:
    """A ``CheckpointHook``'s file backend whose ``remove`` and ``rmtree``
    go through :func:`remove_checkpoint_file`; every other method is the
    backend's.

    Args:
        backend: The hook's file backend.
        folder (str): The checkpoint folder (the hook's final ``out_dir``).
        names (Pattern): The names that may be removed.
    """

    def __init__(self, backend: Any, folder: str, names: Pattern) -> None:
        self.backend = backend
        self.folder = str(folder)
        self.names = names

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    def remove(self, filepath: Any) -> None:
        """Remove a checkpoint file (see :func:`remove_checkpoint_file`);
        a refusal is logged as a WARNING, a missing file is not."""
        path = str(filepath)
        if not is_local_path(self.folder):
            problem = None
            if not self.names.fullmatch(osp.basename(path)):
                problem = 'its name is not one a CheckpointHook writes'
            elif not inside_folder(path, self.folder):
                problem = 'it is not directly in the checkpoint folder'
            if problem is None:
                self.backend.remove(path)
                return
        else:
            problem = remove_checkpoint_file(self.folder, path, self.names)
        if problem is not None and problem != MISSING:
            _kept(path, problem)

    def rmtree(self, dir_path: Any) -> None:
        """Remove a checkpoint folder (see :func:`remove_checkpoint_file`);
        a remote one is kept, with a WARNING."""
        if not is_local_path(self.folder):
            _kept(str(dir_path), 'it is a remote folder')
            return
        self.remove(dir_path)


def _kept(path: str, problem: str) -> None:
    print_log(
        f'nanguard: kept {path!r} instead of removing it: {problem}',
        logger='current',
        level=logging.WARNING,
    )


__all__ = [
    'MISSING',
    'CheckpointRemovalBackend',
    'checkpoint_names',
    'inside_folder',
    'numbered_name',
    'remove_checkpoint_file',
]
