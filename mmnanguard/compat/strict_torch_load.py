# Copyright (c) mmnanguard contributors. All rights reserved.
"""Mend: mmengine's ``_safe_torch_load`` runs a refused checkpoint
(onedl-mmengine 0.10.12; mmengine 0.10.7 has no such function).

onedl-mmengine loads every checkpoint through
``mmengine.runner.checkpoint._safe_torch_load``. With ``weights_only``
left unset it loads with ``weights_only=True`` and an allowlist that holds
the unrestricted ``builtins.getattr`` and ``HistoryBuffer`` (the two
entries through which a crafted file reaches any global), and when the
unpickler still refuses the file it logs a warning and loads it again with
``weights_only=False``, which runs whatever the file holds. The remote
schemes (``http://``, ``open-mmlab://``, ``s3://``, ``pavi://``, the
local ``open-mmlab`` cache) all go through it.

The mend replaces it with :func:`strict_torch_load`: ``weights_only=True``
with the checkpoint allowlist of :mod:`.checkpoint_allowlist` in scope for
that one load, and :class:`~.checkpoint_allowlist.UntrustedCheckpointError`
instead of the second, unsafe load. A caller that passes ``weights_only``
explicitly gets exactly that, as before. It can go once onedl-mmengine
stops falling back.
"""

import io
from typing import Any, Optional

import torch
from mmengine.runner import checkpoint as mmengine_checkpoint

from mmnanguard.function_marks import mark

from .checkpoint_allowlist import (
    UntrustedCheckpointError,
    check_loaded,
    mmengine_checkpoint_globals,
)
from .safe_load import weights_only_load

TARGET = '_safe_torch_load'


def strict_torch_load(
    file: Any, map_location: Any = None, weights_only: Optional[bool] = None
) -> Any:
    """``_safe_torch_load`` without the ``weights_only=False`` fallback.

    Args:
        file (str | file-like): The checkpoint.
        map_location: Same as :func:`torch.load`.
        weights_only (bool, optional): None (mmengine's callers): the
            scoped allowlist and no fallback. True or False: passed to
            :func:`torch.load` unchanged.

    Returns:
        The loaded checkpoint.

    Raises:
        UntrustedCheckpointError: The file holds globals or calls outside
            the allowlist; it names the file and what was refused, and
            nothing from the file has run.
    """
    if weights_only is not None:
        return torch.load(
            file, map_location=map_location, weights_only=weights_only
        )
    name = None
    if not isinstance(file, str):  # a downloaded buffer (s3://, petrel://)
        name = getattr(file, 'name', 'a downloaded checkpoint')
        file = io.BytesIO(file.read() if hasattr(file, 'read') else file)
    checkpoint = weights_only_load(
        file,
        mmengine_checkpoint_globals(),
        what='checkpoint',
        error=UntrustedCheckpointError,
        map_location=map_location,
        name=name,
    )
    check_loaded(checkpoint, name or file)
    return checkpoint


mark(strict_torch_load, 'nanguard_mend')


def is_needed() -> bool:
    """Whether this mmengine has a ``_safe_torch_load`` not yet mended."""
    current = getattr(mmengine_checkpoint, TARGET, None)
    return current is not None and not getattr(current, 'nanguard_mend', False)


def apply() -> bool:
    """Replace ``_safe_torch_load`` with :func:`strict_torch_load`.

    Returns:
        bool: Whether anything was changed.
    """
    if not is_needed():
        return False
    setattr(mmengine_checkpoint, TARGET, strict_torch_load)
    return True


__all__ = ['apply', 'is_needed', 'strict_torch_load']
