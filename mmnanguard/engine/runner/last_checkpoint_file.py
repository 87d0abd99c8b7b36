# Copyright (c) mmnanguard contributors. All rights reserved.
"""``<work_dir>/last_checkpoint``, read as the hostile input it may be.

mmengine writes one line there, the path of the latest checkpoint, and
reads it back with ``open(...).read()``: a NUL byte ends a resume in
``ValueError: embedded null byte``, bytes that are not UTF-8 in a
``UnicodeDecodeError``, and a FIFO or ``/dev/zero`` planted under that
name blocks the read or fills the memory. :func:`read_checked_last_checkpoint`
reads it without following a link, at most :data:`MAX_LAST_CHECKPOINT`
bytes, and raises :class:`~.resume_errors.CheckpointValueError` naming
the file and what is wrong with it. The protected resume
(:mod:`.resume_choice`) and the doctor (``rules_resume``) read it so.
"""

import os
import os.path as osp
import stat
from typing import Optional, Tuple

from mmnanguard.fileio.checkpoint_verify import LAST_CHECKPOINT

from .resume_errors import CheckpointValueError

#: The most bytes ``last_checkpoint`` may hold: Linux's ``PATH_MAX``.
MAX_LAST_CHECKPOINT = 4096


def last_checkpoint_problem(marker: str) -> Tuple[Optional[str], str]:
    """Read ``marker`` (a ``last_checkpoint`` file) and say what is wrong.

    Args:
        marker (str): The file.

    Returns:
        tuple[str | None, str]: The problem (a phrase to follow the file
        name; None: none) and the path it names (stripped; ``''`` when
        empty or when there is a problem).
    """
    try:
        info = os.lstat(marker)
    except FileNotFoundError:
        return None, ''
    except OSError as err:
        return f'cannot be read ({err.strerror})', ''
    if not stat.S_ISREG(info.st_mode):
        return (
            'is not a regular file (a link, a folder, a pipe or a device)',
            '',
        )
    if info.st_size > MAX_LAST_CHECKPOINT:
        return (
            f'holds {info.st_size} bytes, more than the '
            f'{MAX_LAST_CHECKPOINT} of a path'
        ), ''
    flags = os.O_RDONLY | getattr(os, 'O_NOFOLLOW', 0)
    flags |= getattr(os, 'O_NONBLOCK', 0)
    try:
        fd = os.open(marker, flags)
    except OSError as err:
        return f'cannot be opened ({err.strerror})', ''
    with os.fdopen(fd, 'rb') as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return 'is not a regular file (it was replaced)', ''
        data = f.read(MAX_LAST_CHECKPOINT + 1)
    if len(data) > MAX_LAST_CHECKPOINT:
        return f'holds more than {MAX_LAST_CHECKPOINT} bytes', ''
    try:
        text = data.decode('utf-8')
    except UnicodeDecodeError as err:
        return f'is not UTF-8 text (byte {err.start})', ''
    if '\0' in text:
        return f'holds a NUL byte (at {text.index(chr(0))})', ''
    return None, text.strip()


def read_checked_last_checkpoint(work_dir: str) -> Tuple[bool, str]:
    """Read ``<work_dir>/last_checkpoint``, refusing a hostile one.

    Args:
        work_dir (str): The run's work dir.

    Returns:
        tuple[bool, str]: Whether the file exists, and the path it names
        (stripped; ``''`` when it is empty).

    Raises:
        CheckpointValueError: It is not a regular file, holds more than
            :data:`MAX_LAST_CHECKPOINT` bytes, is not UTF-8 text or holds
            a NUL byte.
    """
    marker = osp.join(work_dir, LAST_CHECKPOINT)
    problem, named = last_checkpoint_problem(marker)
    if problem is not None:
        raise CheckpointValueError(
            f'nanguard: cannot resume: {marker!r} {problem}; expected one '
            'line of UTF-8 text naming the checkpoint to resume from, as '
            'mmengine writes it. Remove the file to resume from the newest '
            'checkpoint of the work dir, or name one with --resume CKPT.'
        )
    return osp.lexists(marker), named


__all__ = [
    'MAX_LAST_CHECKPOINT',
    'last_checkpoint_problem',
    'read_checked_last_checkpoint',
]
