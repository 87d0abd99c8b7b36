# Copyright (c) mmnanguard contributors. All rights reserved.
"""Mend: resume and rollback under torch >= 2.6 ``weights_only`` loading.

From torch 2.6 on, :func:`torch.load` defaults to ``weights_only=True`` and
refuses every global outside an allowlist. mmengine <= 0.10.7 calls
``torch.load(filename, map_location=...)`` without ``weights_only``, and its
checkpoints hold the message hub's :class:`HistoryBuffer` and numpy arrays
and scalars. ``Runner.resume`` then fails with ``UnpicklingError: Weights
only load failed``.

The mend re-registers mmengine's local-file checkpoint loader (the one
behind ``CheckpointLoader.load_checkpoint``, ``load_checkpoint``,
``Runner.resume`` and ``Runner.load_checkpoint``) with
:func:`load_from_local`: ``weights_only=True``, and *exactly* the globals
that mmengine checkpoints contain (:func:`mmengine_checkpoint_globals`)
allowlisted for the duration of that one load. The remote schemes
(``http://``, ``open-mmlab://``, ...) registered at that moment get the
same scope around their own download-and-load (:func:`scoped_loader`).
torch's process-wide allowlist is left as it is: a plain
:func:`torch.load` elsewhere refuses what torch alone refuses. A
checkpoint holding anything else raises :class:`UntrustedCheckpointError`,
naming the file and the offending globals, or the refused call when there
is no foreign global. It can go once mmengine loads with an allowlist
itself.
"""

import functools
import os.path as osp
import pickle
from typing import Any, Callable, List

import numpy as np
import torch
from mmengine.runner.checkpoint import CheckpointLoader
from mmengine.utils import digit_version

from mmnanguard.function_marks import mark

from . import checked_history_buffer
from .restricted_getattr import RestrictedGetattr
from .safe_load import (
    UntrustedFileError,
    globals_outside,
    refusal_message,
    scoped_safe_globals,
    unpickler_reason,
    weights_only_load,
)


class UntrustedCheckpointError(UntrustedFileError):
    """A checkpoint holds objects outside the allowlist of safe globals."""


def _numpy_core():
    """``numpy._core`` on numpy >= 2, ``numpy.core`` before."""
    core = getattr(np, '_core', None)
    if core is None or not hasattr(core, 'multiarray'):
        core = np.core
    return core


def numpy_dtype_classes() -> List[type]:
    """The dtype classes of booleans and numbers (``Float64DType``, ...).

    The unpickler restores a dtype with ``BUILD``, which torch allows only
    on instances of allowlisted types; ``type(np.dtype('f8'))`` is
    ``numpy.dtypes.Float64DType`` on numpy >= 1.25 (``np.dtype`` itself
    before). Object, string, bytes, void and datetime dtypes are left out:
    no checkpoint or batch of this stack holds them.
    """
    dtypes = getattr(np, 'dtypes', None)
    if dtypes is None:
        return []
    found: List[type] = []
    for name in sorted(dir(dtypes)):
        cls = getattr(dtypes, name)
        if not (isinstance(cls, type) and issubclass(cls, np.dtype)):
            continue
        # the scalar class (a class attribute here; numpy's stubs have the
        # instance property only)
        scalar = getattr(cls, 'type', None)
        if (
            isinstance(scalar, type)
            and issubclass(scalar, (np.bool_, np.number))
            and cls not in found
        ):
            found.append(cls)
    return found


#: The dtype kinds a checkpoint or batch may hold: bool, signed and
#: unsigned integers, floats, complex numbers.
NUMERIC_KINDS = 'biufc'
#: The name a pickled dtype is called by.
DTYPE_NAME = 'numpy.dtype'


def checked_dtype(*args: Any) -> np.dtype:
    """``numpy.dtype`` as the unpickler calls it, for bool and numeric
    dtypes only.

    A dtype pickles as ``numpy.dtype('f8', False, True)`` (a type code,
    ``align``, ``copy``). Registered under the name ``numpy.dtype`` instead
    of the class itself, so an array of object (or string, void, datetime)
    dtype is refused before any of its items is read.

    Raises:
        pickle.UnpicklingError: The arguments are not a type code and two
            booleans, or the dtype is not bool or numeric; naming them.
    """
    if not (
        1 <= len(args) <= 3
        and type(args[0]) is str
        and all(type(arg) is bool for arg in args[1:])
    ):
        raise pickle.UnpicklingError(
            f'the call numpy.dtype{_short_args(args)} is not on the '
            "allowlist: expected numpy.dtype('<type code>', bool, bool)"
        )
    try:
        dtype = np.dtype(*args)
    except (TypeError, ValueError) as err:
        raise pickle.UnpicklingError(
            f'the call numpy.dtype{_short_args(args)} failed: {err}'
        ) from err
    if dtype.kind not in NUMERIC_KINDS:
        raise pickle.UnpicklingError(
            f'the call numpy.dtype({args[0]!r}) makes a dtype of kind '
            f'{dtype.kind!r} ({dtype}); only bool and numeric dtypes (kinds '
            f'{", ".join(NUMERIC_KINDS)}) are on the allowlist'
        )
    return dtype


def _short_args(args: tuple) -> str:
    text = repr(args)
    return text if len(text) <= 80 else text[:77] + '...'


def numpy_globals() -> List[Any]:
    """What numpy arrays, dtypes and scalars pickle to, and nothing else.

    ``numpy.dtype`` resolves to :func:`checked_dtype` (bool and numeric
    dtypes only). The dtype classes (``Float64DType``, ...) are listed for
    ``BUILD``, which restores a dtype's byte order. Before numpy 1.25 a
    dtype's class is ``numpy.dtype`` itself: it is then listed under a
    name that no file can reference (a pickle's global names hold no
    newline), for ``BUILD`` only. ``bytes`` is the data of an empty array
    (protocol 2 pickles ``b''`` as ``bytes()``).
    """
    multiarray = _numpy_core().multiarray
    classes: List[Any] = numpy_dtype_classes()
    if not classes:
        classes = [(np.dtype, DTYPE_NAME + '\n(BUILD only)')]
    return [
        np.ndarray,
        (checked_dtype, DTYPE_NAME),
        multiarray._reconstruct,
        multiarray.scalar,
        bytes,
    ] + classes


def check_loaded(obj: Any, path: str, what: str = 'checkpoint') -> None:
    """Refuse what the unpickler let through but no honest file holds.

    * a ``HistoryBuffer`` stand-in that was created (``NEWOBJ``) but never
      restored (no ``BUILD``): unchecked, and without a buffer's
      attributes;
    * a numpy array whose dtype is not bool or numeric.

    Args:
        obj: What :func:`torch.load` returned.
        path (str): The file, for the message.
        what (str): What the file is, for the message.

    Raises:
        UntrustedCheckpointError: Naming the file and what was found.
    """
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(item)
        elif isinstance(item, checked_history_buffer.CheckedHistoryBuffer):
            raise UntrustedCheckpointError(
                refusal_message(
                    what,
                    path,
                    'it creates a HistoryBuffer (NEWOBJ) that it never '
                    'restores (no BUILD): the state of such a buffer is '
                    'unchecked',
                )
            )
        elif (
            isinstance(item, np.ndarray)
            and item.dtype.kind not in NUMERIC_KINDS
        ):
            raise UntrustedCheckpointError(
                refusal_message(
                    what,
                    path,
                    f'it holds a numpy array of dtype {item.dtype}; only '
                    'bool and numeric arrays are on the allowlist',
                )
            )


def mmengine_checkpoint_globals() -> List[Any]:
    """The allowlist of an mmengine checkpoint, and nothing beyond it.

    Read off real checkpoints of this stack (every supported config
    family, see the tests) with
    ``torch.serialization.get_unsafe_globals_in_checkpoint``:

    * ``HistoryBuffer`` (the message hub's logged scalars), as the checked
      stand-in :class:`~.checked_history_buffer.CheckedHistoryBuffer`;
    * ``builtins.getattr``, as a :class:`RestrictedGetattr` that resolves
      only the buffer's four statistics methods (pickled as
      ``getattr(HistoryBuffer, 'mean')``);
    * what numpy arrays, dtypes and scalars pickle to (the histories, the
      message hub's runtime information such as the seed), with
      ``numpy.dtype`` as :func:`checked_dtype` (bool and numeric only).

    :func:`check_loaded` then refuses a buffer that was never restored.

    Returns:
        list: Entries for ``torch.serialization.safe_globals``.
    """
    lookup = RestrictedGetattr(checked_history_buffer.getattr_pairs())
    return (
        checked_history_buffer.safe_global_entries()
        + [(lookup, 'builtins.getattr')]
        + numpy_globals()
    )


def is_needed() -> bool:
    """Whether torch defaults to ``weights_only=True`` (torch >= 2.6)."""
    return digit_version(torch.__version__) >= digit_version(
        '2.6.0'
    ) and hasattr(torch.serialization, 'safe_globals')


def load_from_local(filename: str, map_location: Any = None) -> dict:
    """mmengine's local checkpoint loader, with the scoped allowlist.

    Args:
        filename (str): Local checkpoint path.
        map_location (str, optional): Same as :func:`torch.load`.

    Returns:
        dict: The loaded checkpoint.

    Raises:
        FileNotFoundError: There is no such file.
        UntrustedCheckpointError: The file holds globals or calls outside
            the allowlist. The message names the file and what was
            refused; nothing from the file was run.
    """
    filename = osp.expanduser(filename)
    if not osp.isfile(filename):
        raise FileNotFoundError(f'{filename} can not be found.')
    return load_with_allowlist(
        filename, mmengine_checkpoint_globals(), map_location
    )


def load_with_allowlist(
    filename: str, entries: List[Any], map_location: Any = None
) -> Any:
    """A checkpoint file loaded with ``weights_only=True`` and ``entries``
    in scope (after the check of its declared sizes), then checked
    (:func:`check_loaded`).

    Args:
        filename (str): The file.
        entries (list): The allowlist (:func:`mmengine_checkpoint_globals`
            and what a strategy's checkpoint adds to it).
        map_location: Same as :func:`torch.load`.

    Raises:
        UntrustedCheckpointError: The file holds globals or calls outside
            ``entries``; nothing from it was run.
    """
    checkpoint = weights_only_load(
        filename,
        entries,
        what='checkpoint',
        error=UntrustedCheckpointError,
        map_location=map_location,
    )
    check_loaded(checkpoint, filename)
    return checkpoint


def scoped_loader(loader: Callable) -> Callable:
    """One of mmengine's scheme loaders, with the allowlist in scope.

    Args:
        loader (Callable): ``loader(filename, map_location)``, e.g.
            mmengine's ``load_from_http``.

    Returns:
        Callable: The same call (and ``__name__``, which mmengine logs);
        a refusal raises :class:`UntrustedCheckpointError` naming
        ``filename`` and the unpickler's reason.
    """
    if getattr(loader, 'nanguard_scoped', False):
        return loader

    @functools.wraps(loader)
    def load(filename: str, map_location: Any = None) -> Any:
        with scoped_safe_globals(mmengine_checkpoint_globals()):
            try:
                checkpoint = loader(filename, map_location)
            except pickle.UnpicklingError as err:
                reason = (
                    'the unpickler refused a global, a call or an '
                    f'operation: {unpickler_reason(str(err))}'
                )
                raise UntrustedCheckpointError(
                    refusal_message('checkpoint', filename, reason)
                ) from err
        check_loaded(checkpoint, filename)
        return checkpoint

    return mark(load, 'nanguard_scoped')


def unsafe_globals(filename: str) -> List[str]:
    """The globals in ``filename`` outside the checkpoint allowlist.

    Args:
        filename (str): A ``torch.save`` file (zip format).

    Returns:
        list[str]: Sorted ``module.name`` strings; ``[]`` also for a file
        the static scan cannot read.
    """
    with scoped_safe_globals(mmengine_checkpoint_globals()):
        return globals_outside(filename)


def apply() -> bool:
    """Route mmengine's checkpoint loading through the scoped allowlist.

    Returns:
        bool: Whether the mend was applied.
    """
    if not is_needed():
        return False
    remote = [(p, f) for p, f in CheckpointLoader._schemes.items() if p]
    for prefix, loader in remote:
        CheckpointLoader.register_scheme(
            prefixes=prefix, loader=scoped_loader(loader), force=True
        )
    CheckpointLoader.register_scheme(
        prefixes='', loader=load_from_local, force=True
    )
    return True


__all__ = [
    'UntrustedCheckpointError',
    'apply',
    'check_loaded',
    'checked_dtype',
    'is_needed',
    'load_from_local',
    'load_with_allowlist',
    'mmengine_checkpoint_globals',
    'numpy_globals',
    'scoped_loader',
    'unsafe_globals',
]
