# Copyright (c) mmnanguard contributors. All rights reserved.
"""Mend: resume and rollback under torch >= 2.6 ``weights_only`` loading.

From torch 2.6 on, :func:`torch.load` defaults to ``weights_only=True`` and
refuses every global outside an allowlist. mmengine <= 0.10.7 calls
``torch.load(filename, map_location=...)`` without ``weights_only``, and its
checkpoints hold the message hub's :class:`HistoryBuffer` and numpy arrays
and scalars. ``Runner.resume`` then fails with ``UnpicklingError: Weights
only load failed``.

The mend keeps ``weights_only=True`` and adds *exactly* the globals that
mmengine checkpoints contain (:data:`MMENGINE_CHECKPOINT_GLOBALS`) to torch's
allowlist. A checkpoint holding anything else is still refused; mmengine's
local-file loader is re-registered so that the refusal names the file and
the offending globals (:class:`UntrustedCheckpointError`) instead of a bare
``UnpicklingError``. It can go once mmengine loads with an allowlist itself.
"""

import os.path as osp
import pickle
from typing import Callable, List

import numpy as np
import torch
from mmengine.logging.history_buffer import HistoryBuffer
from mmengine.runner.checkpoint import CheckpointLoader
from mmengine.utils import digit_version


class UntrustedCheckpointError(pickle.UnpicklingError):
    """A checkpoint holds objects outside the allowlist of safe globals."""


def _numpy_core():
    """``numpy._core`` on numpy >= 2, ``numpy.core`` before."""
    core = getattr(np, '_core', None)
    if core is None or not hasattr(core, 'multiarray'):
        core = np.core
    return core


def mmengine_checkpoint_globals() -> List[Callable]:
    """The globals that an mmengine checkpoint contains, and no others.

    Read off real checkpoints of this stack with
    ``torch.serialization.get_unsafe_globals_in_checkpoint``.
    """
    multiarray = _numpy_core().multiarray
    found = [
        HistoryBuffer,
        np.ndarray,
        np.dtype,
        multiarray._reconstruct,
        multiarray.scalar,
        # numpy >= 1.25 pickles a dtype as ``numpy.dtypes.Float64DType`` ...
        # reached through ``getattr``; the unpickler still refuses to *call*
        # anything the getattr returns unless it is allowlisted too.
        getattr,
    ]
    dtypes = getattr(np, 'dtypes', None)
    if dtypes is not None:
        found += [
            getattr(dtypes, name)
            for name in dir(dtypes)
            if name.endswith('DType')
        ]
    return found


def is_needed() -> bool:
    """Whether torch defaults to ``weights_only=True`` (torch >= 2.6)."""
    return digit_version(torch.__version__) >= digit_version(
        '2.6.0'
    ) and hasattr(torch.serialization, 'add_safe_globals')


def load_from_local(filename: str, map_location=None) -> dict:
    """mmengine's local checkpoint loader, with a clear refusal.

    Args:
        filename (str): Local checkpoint path.
        map_location (str, optional): Same as :func:`torch.load`.

    Returns:
        dict: The loaded checkpoint.

    Raises:
        UntrustedCheckpointError: The file holds globals outside the
            allowlist. The message names the file and those globals.
    """
    filename = osp.expanduser(filename)
    if not osp.isfile(filename):
        raise FileNotFoundError(f'{filename} can not be found.')
    try:
        return torch.load(filename, map_location=map_location)
    except pickle.UnpicklingError as err:
        raise UntrustedCheckpointError(
            f'Refusing to load checkpoint {filename!r}: it contains objects '
            f'outside the allowlist of safe globals '
            f'({unsafe_globals(filename)}). mmnanguard allows only what '
            'mmengine checkpoints hold. If you trust this file, load it '
            'yourself with torch.load(..., weights_only=False) and save '
            'its tensors again.'
        ) from err


def unsafe_globals(filename: str) -> List[str]:
    """List the globals in ``filename`` that the allowlist does not cover."""
    try:
        found = torch.serialization.get_unsafe_globals_in_checkpoint(filename)
    except Exception as err:  # a corrupt file: say so instead of the list
        return [f'<unreadable: {err}>']
    allowed = {
        f'{g.__module__}.{g.__qualname__}'
        for g in mmengine_checkpoint_globals()
    }
    return [name for name in found if name not in allowed]


def apply() -> bool:
    """Allowlist the mmengine checkpoint globals where torch needs it.

    Returns:
        bool: Whether the mend was applied.
    """
    if not is_needed():
        return False
    torch.serialization.add_safe_globals(mmengine_checkpoint_globals())
    CheckpointLoader.register_scheme(
        prefixes='', loader=load_from_local, force=True
    )
    return True
