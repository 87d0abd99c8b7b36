# Copyright (c) mmnanguard contributors. All rights reserved.
"""Load a torch file with ``weights_only=True`` and an allowlist in scope.

torch's ``weights_only`` unpickler refuses every global outside its
allowlist. :func:`torch.serialization.add_safe_globals` widens that
allowlist for the whole process, for every later :func:`torch.load`.
:func:`scoped_safe_globals` widens it only while one file is read, and
:func:`weights_only_load` turns a refusal into an error that names the
file and what was refused: the globals outside the allowlist, or, where
the file references none, the call or operation the unpickler refused.

The scope is process-wide while it lasts: another thread calling
:func:`torch.load` at the same moment sees the same entries.
"""

import contextlib
import io
import os
import pickle
import re
import stat
import zipfile
from typing import Any, Iterator, List, Optional, Sequence, Type, cast

import torch

from .declared_sizes import check_declared_sizes, size_problem

#: How a file to load is opened: without blocking on a FIFO (which is
#: then passed over, never read here).
_READ_FLAGS = (
    os.O_RDONLY | getattr(os, 'O_NONBLOCK', 0) | getattr(os, 'O_CLOEXEC', 0)
)

#: What the allowlist of ``torch.serialization.safe_globals`` accepts: a
#: class or function, or ``(object, 'module.qualname')``.
SafeGlobal = Any


class UntrustedFileError(pickle.UnpicklingError):
    """A file holds objects or operations outside the allowlist."""


@contextlib.contextmanager
def scoped_safe_globals(entries: Sequence[SafeGlobal]) -> Iterator[None]:
    """Add ``entries`` to torch's allowlist for the ``with`` block only.

    Entries that were on the allowlist before stay there afterwards (torch's
    own ``safe_globals`` removes them on exit).

    Args:
        entries (Sequence): Classes, functions or ``(object, name)`` pairs.
    """
    present = set(torch.serialization.get_safe_globals())
    added = [entry for entry in entries if entry not in present]
    with torch.serialization.safe_globals(added):
        yield


def unpickler_reason(message: str) -> str:
    """The unpickler's own sentence out of torch's long refusal message.

    Args:
        message (str): ``str()`` of the ``UnpicklingError`` that
            :func:`torch.load` raised.

    Returns:
        str: The part after ``WeightsUnpickler error:``, without torch's
        advice and documentation link.
    """
    marker = 'WeightsUnpickler error: '
    if marker in message:
        message = message.rsplit(marker, 1)[1]
    elif '\n\n' in message:
        message = message.split('\n\n', 1)[1]
    message = message.split('\n\nCheck the documentation of torch.load')[0]
    return ' '.join(message.split())


def globals_outside(path: str) -> List[str]:
    """The globals that ``path`` references outside the current allowlist.

    Read without unpickling (``get_unsafe_globals_in_checkpoint``); a file
    in torch's legacy format, one the scan cannot read, or one whose
    declared sizes exceed its own (:mod:`.declared_sizes`) yields ``[]``
    (the unpickler's own reason names what it refused then).

    Args:
        path (str): A ``torch.save`` file.

    Returns:
        list[str]: Sorted ``module.name`` strings.
    """
    try:
        if hasattr(path, 'seek'):  # a buffer that a failed load has read
            path.seek(0)
        if size_problem(path) is not None:  # torch would allocate it
            return []
        return sorted(
            torch.serialization.get_unsafe_globals_in_checkpoint(path)
        )
    except (
        ValueError,
        RuntimeError,
        EOFError,
        pickle.UnpicklingError,
        zipfile.BadZipFile,
    ):
        return []


def describe_refusal(path: str, err: Exception) -> str:
    """Say what in ``path`` the unpickler refused.

    Call it with the allowlist of the refused load still in scope.

    Args:
        path (str): The refused file.
        err (Exception): The ``UnpicklingError`` of :func:`torch.load`.

    Returns:
        str: ``it references globals outside the allowlist: [...]`` (read
        off the file, or, for the legacy format, off the unpickler's
        reason), or, when the file references none, ``the unpickler
        refused a call or operation: ...`` with the unpickler's reason.
    """
    foreign = globals_outside(path)
    reason = unpickler_reason(str(err))
    refused_global = re.search(r'GLOBAL (\S+)', reason)
    if not foreign and refused_global:  # a legacy-format file: not scanned
        foreign = [refused_global.group(1)]
    if foreign:
        return f'it references globals outside the allowlist: {foreign}'
    return f'the unpickler refused a call or operation: {reason}'


def weights_only_load(
    path: str,
    entries: Sequence[SafeGlobal],
    what: str,
    error: Type[Exception] = UntrustedFileError,
    map_location: Any = None,
    name: Optional[str] = None,
) -> Any:
    """``torch.load(path, weights_only=True)`` with ``entries`` in scope.

    Args:
        path (str | file-like): The file, or a downloaded buffer.
        entries (Sequence): The allowlist for this file (see
            :func:`scoped_safe_globals`).
        what (str): What the file is, for the message (``'checkpoint'``).
        error (type): The exception raised on a refusal; it takes the
            message as its only argument.
        map_location: Same as :func:`torch.load`.
        name (str, optional): What the message calls the file (a
            buffer's URL). Defaults to ``path``.

    Returns:
        The unpickled object.

    Raises:
        DeclaredSizeError: The file declares more bytes than it holds (a
            decompression bomb, :mod:`.declared_sizes`); nothing was read.
        error: The unpickler refused something; the message names
            ``path`` and what was refused.
    """
    with _opened_once(path) as file:
        check_declared_sizes(file, what, name or path)
        with scoped_safe_globals(entries):
            try:
                return torch.load(
                    file, map_location=map_location, weights_only=True
                )
            except pickle.UnpicklingError as err:
                reason = describe_refusal(file, err)
                raise error(
                    refusal_message(what, name or path, reason)
                ) from err


@contextlib.contextmanager
def _opened_once(path: Any) -> Iterator[Any]:
    """``path`` opened once, so that the file whose sizes are checked is
    the file that is loaded: a file swapped under the same name in between
    is not read. A buffer, and a path that is not a regular file (a FIFO,
    a device: the loader names it), are passed through as they are."""
    if not isinstance(path, (str, os.PathLike)):
        yield path
        return
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError:
        yield path  # the loader raises the error that names the file
        return
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        yield path
        return
    with os.fdopen(fd, 'rb') as file:
        # fdopen(fd, 'rb') buffers a FileIO (typeshed: any raw stream)
        raw = cast(io.FileIO, file.raw)
        raw.name = os.fspath(path)  # for messages, as open() names it
        yield file


def refusal_message(what: str, path: str, reason: str) -> str:
    """The message of a refused load.

    Args:
        what (str): What the file is (``'checkpoint'``).
        path (str): The file (or URL).
        reason (str): What was refused (see :func:`describe_refusal`).

    Returns:
        str: One paragraph naming the file and the reason.
    """
    return (
        f'Refusing to load the {what} {path!r}: {reason}. Nothing from it '
        'was run. Only data (tensors, numpy arrays and the listed classes) '
        'is loaded from such files; if you trust this one, load it '
        'yourself with torch.load(..., weights_only=False) and save its '
        'tensors again.'
    )
