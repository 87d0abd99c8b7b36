# Copyright (c) mmnanguard contributors. All rights reserved.
"""The values of a resumed checkpoint that mmengine acts on, checked.

A checkpoint is data, and mmengine 0.10.7 trusts two parts of it:

* ``meta``: ``iter`` and ``epoch`` become the train loop's counters
  (``meta.iter='3'`` ended in a ``TypeError`` at the first comparison);
* ``message_hub.runtime_info``: ``CheckpointHook.before_train`` takes
  ``best_ckpt`` (``best_ckpt_<metric>``) as the file to remove when a
  better one is saved, and ``keep_ckpt_ids`` as the rotation, removing
  the ids beyond ``max_keep_ckpts`` at once. A crafted ``best_ckpt`` and
  ``best_score=-1e30`` with ``save_best`` deleted any file;
  ``keep_ckpt_ids=['/../../../victim', 2, 3]`` removed a folder outside
  the work dir; ``keep_ckpt_ids=[1000, 2, 3]`` a complete
  ``iter_1000.pth`` the rotation never held.

:func:`check_resumed_values` runs after ``runner.resume(path)`` and
before ``before_train`` (where the hooks read ``runtime_info``):

* ``meta.iter`` and ``meta.epoch`` must be ints >= 0 (not bool), else
  :class:`~.resume_errors.CheckpointValueError` (``tools/train.py`` exits
  2);
* each path of ``runtime_info`` (``best_ckpt*``, ``last_ckpt``) must be a
  string naming a file of a checkpoint's name (:func:`~.checkpoint_removal.
  checkpoint_names`) directly in the run's checkpoint folder (the
  ``CheckpointHook``'s ``out_dir``), and if there, a regular file;
  ``best_score*`` must be a finite number; ``keep_ckpt_ids`` must be a
  list of distinct ints in ``[0, resumed step]`` whose file is a regular
  file of the rotation's name in that folder. What is not is dropped from
  ``runtime_info`` (the keys) or the list (the ids), with one WARNING per
  key naming the checkpoint, the key, the value and why; mmengine then
  acts as if it had never been saved (a best checkpoint is not removed,
  an id is not rotated).

The file-system checks run on every rank against its own view of the
folder; only the main process removes files. Without a
``CheckpointHook`` nothing reads ``runtime_info``'s paths, and they are
left as they are.
"""

import logging
import math
import os
import os.path as osp
import stat
from numbers import Integral, Real
from typing import Any, List, Optional, Pattern, Tuple

from mmengine.hooks import CheckpointHook
from mmengine.logging import print_log

from mmnanguard.fileio.checkpoint_verify import is_local_path

from .checkpoint_removal import checkpoint_names, inside_folder
from .resume_errors import CheckpointValueError

#: The ``runtime_info`` keys that hold a checkpoint's path (and prefixes).
PATH_KEYS = ('best_ckpt', 'last_ckpt')
#: The ``runtime_info`` keys that hold a best score (and prefixes).
SCORE_KEYS = ('best_score',)


def _is_count(value: Any) -> bool:
    return (
        isinstance(value, Integral)
        and not isinstance(value, bool)
        and int(value) >= 0  # numbers.Integral declares no >=
    )


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + '...'


def checkpoint_folder(runner: Any, hook: CheckpointHook) -> str:
    """The folder ``hook`` saves into, computed before ``before_train``
    as mmengine 0.10.7 computes it there (``out_dir``, or the work dir;
    a configured ``out_dir`` gets the work dir's last part appended).

    Args:
        runner: The runner.
        hook (CheckpointHook): Its checkpoint hook (``before_train`` not
            run yet).

    Returns:
        str: The folder.
    """
    work_dir = runner.work_dir
    if hook.out_dir is None:
        return work_dir
    out_dir = str(hook.out_dir)
    if out_dir == work_dir:
        return out_dir
    last = osp.basename(work_dir.rstrip(osp.sep))
    if is_local_path(out_dir):
        return osp.join(out_dir, last)
    return f'{out_dir.rstrip("/")}/{last}'


def _regular_file_problem(path: str) -> Optional[str]:
    """Why the entry at ``path`` is not a regular file (None: it is one,
    or there is nothing there)."""
    if not is_local_path(path):
        return None
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        return f'it cannot be looked at ({err})'
    if not stat.S_ISREG(info.st_mode):
        return 'it is not a regular file (a link, a folder or a device)'
    return None


def path_problem(value: Any, folder: str, names: Pattern) -> Optional[str]:
    """Why ``value`` is not a path a ``CheckpointHook`` may act on.

    Args:
        value: A ``runtime_info`` path.
        folder (str): The checkpoint folder.
        names (Pattern): The checkpoint names (``fullmatch``).

    Returns:
        str | None: A phrase, or None when it is one.
    """
    if not isinstance(value, str):
        return f'it is a {type(value).__name__}, not a path'
    if '\0' in value:
        return 'it holds a NUL byte'
    if not names.fullmatch(osp.basename(value)):
        return f'its file name does not match {names.pattern}'
    if not inside_folder(value, folder):
        return f'it is not directly in the checkpoint folder {folder!r}'
    return _regular_file_problem(value)


def kept_ids(
    value: Any, folder: str, hook: CheckpointHook, last_step: int
) -> Tuple[List[int], List[str]]:
    """The ids of ``keep_ckpt_ids`` the rotation may act on.

    Args:
        value: The resumed ``keep_ckpt_ids``.
        folder (str): The checkpoint folder.
        hook (CheckpointHook): The hook (its ``filename_tmpl``).
        last_step (int): The resumed epoch (``by_epoch``) or iteration:
            the rotation holds no later id.

    Returns:
        tuple[list[int], list[str]]: The ids kept, and one phrase per id
        dropped.
    """
    if not isinstance(value, (list, tuple)):
        return [], [f'it is a {type(value).__name__}, not a list of ints']
    kept: List[int] = []
    dropped: List[str] = []
    for step in value:
        if not _is_count(step) or step > last_step:
            dropped.append(f'{_shown(step)} is not an int in [0, {last_step}]')
            continue
        if step in kept:
            dropped.append(f'{step} is there twice')
            continue
        path = osp.join(folder, hook.filename_tmpl.format(step))
        if is_local_path(folder) and not osp.lexists(path):
            dropped.append(f'{step}: {path!r} does not exist')
            continue
        problem = _regular_file_problem(path)
        if problem is not None:
            dropped.append(f'{step}: {path!r}: {problem}')
            continue
        kept.append(int(step))
    return kept, dropped


def check_resumed_meta(runner: Any, path: str) -> None:
    """Refuse a resumed ``meta.iter`` or ``meta.epoch`` that is not an int
    >= 0 (the train loop took them as they are).

    Args:
        runner: The runner, just resumed.
        path (str): The checkpoint it resumed from.

    Raises:
        CheckpointValueError: Naming the file, the key and the value.
    """
    for key, value in (('iter', runner.iter), ('epoch', runner.epoch)):
        if not _is_count(value):
            raise CheckpointValueError(
                f'nanguard: cannot resume from {path!r}: meta.{key} is '
                f'{_shown(value)} ({type(value).__name__}); expected an '
                'int >= 0, as mmengine writes it. The file was not written '
                'by mmengine as it is; resume from another checkpoint with '
                '--resume CKPT.'
            )


def _warn_dropped(path: str, key: str, value: Any, why: str) -> None:
    print_log(
        f'nanguard: the checkpoint {path!r} holds message_hub.runtime_info.'
        f'{key}={_shown(value)}; dropped: {why}. A CheckpointHook acts only '
        'on files of its own names in its own folder.',
        logger='current',
        level=logging.WARNING,
    )


def check_resumed_runtime_info(
    runner: Any, path: str, hook: Optional[CheckpointHook]
) -> List[str]:
    """Drop from the message hub what ``hook`` must not act on.

    Args:
        runner: The runner, just resumed.
        path (str): The checkpoint it resumed from.
        hook (CheckpointHook, optional): The runner's checkpoint hook;
            None: nothing is checked.

    Returns:
        list[str]: The keys dropped or changed.
    """
    if hook is None:
        return []
    hub = runner.message_hub
    folder = checkpoint_folder(runner, hook)
    names = checkpoint_names(hook.filename_tmpl)
    changed = []
    for key in list(hub.runtime_info):
        value = hub.runtime_info[key]
        why = None
        if key.startswith(PATH_KEYS):
            why = path_problem(value, folder, names)
        elif key.startswith(SCORE_KEYS):
            if (
                isinstance(value, bool)
                or not isinstance(value, Real)
                or not math.isfinite(float(value))
            ):
                why = 'it is not a finite number'
        elif key == 'keep_ckpt_ids':
            step = runner.epoch if hook.by_epoch else runner.iter
            ids, dropped = kept_ids(value, folder, hook, step)
            if dropped:
                _warn_dropped(path, key, value, '; '.join(dropped))
                hub.update_info(key, ids)
                changed.append(key)
            continue
        if why is not None:
            _warn_dropped(path, key, value, why)
            hub.pop_info(key)
            changed.append(key)
    return changed


def check_resumed_values(
    runner: Any, path: str, hook: Optional[CheckpointHook]
) -> List[str]:
    """:func:`check_resumed_meta`, then :func:`check_resumed_runtime_info`
    (see the module docstring).

    Args:
        runner: The runner, just resumed from ``path``.
        path (str): The checkpoint.
        hook (CheckpointHook, optional): The runner's checkpoint hook.

    Returns:
        list[str]: The ``runtime_info`` keys dropped or changed.

    Raises:
        CheckpointValueError: ``meta.iter`` or ``meta.epoch`` is not an
            int >= 0.
    """
    check_resumed_meta(runner, path)
    return check_resumed_runtime_info(runner, path, hook)


__all__ = [
    'check_resumed_meta',
    'check_resumed_runtime_info',
    'check_resumed_values',
    'checkpoint_folder',
    'kept_ids',
    'path_problem',
]
