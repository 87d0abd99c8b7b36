# Copyright (c) mmnanguard contributors. All rights reserved.
"""Mend: DeepSpeed loads every part of its checkpoints with
``weights_only=False`` (deepspeed 0.19.8).

``TorchCheckpointEngine.load``, through which ``DeepSpeedEngine.
load_checkpoint`` reads the model states and every rank's optimizer
partition, calls ``torch.load(path, weights_only=False)``: a crafted
checkpoint folder runs whatever its pickles hold when a run resumes from
it (``DeepSpeedStrategy.resume``).

The mend loads each part with ``weights_only=True`` and
:func:`deepspeed_checkpoint_globals` in scope for that one load (the
mmengine checkpoint allowlist, plus the four classes a DeepSpeed ZeRO-1/2
checkpoint of this stack references, read off real ones with
``get_unsafe_globals_in_checkpoint``: mmengine's ``ConfigDict`` (the
DeepSpeed config) and DeepSpeed's ``LossScaler``, ``ZeroStageEnum`` and
``fragment_address``), after the check of its declared sizes
(:mod:`.declared_sizes`). A refusal raises
:class:`~.checkpoint_allowlist.UntrustedCheckpointError` naming the file
and what was refused. It does nothing where deepspeed is not installed or
its engine already loads with ``weights_only=True``.
"""

import functools
import importlib
import importlib.util
import inspect
from typing import Any, Callable, List

from mmnanguard.function_marks import mark

from .checkpoint_allowlist import (
    load_with_allowlist,
    mmengine_checkpoint_globals,
)

#: The classes a DeepSpeed checkpoint references beyond mmengine's:
#: ``(module, name)``.
DEEPSPEED_CHECKPOINT_CLASSES = (
    ('mmengine.config.config', 'ConfigDict'),
    ('deepspeed.runtime.fp16.loss_scaler', 'LossScaler'),
    ('deepspeed.runtime.zero.config', 'ZeroStageEnum'),
    ('deepspeed.utils.tensor_fragment', 'fragment_address'),
)
_ENGINE = 'deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine'


def deepspeed_checkpoint_globals() -> List[Any]:
    """The allowlist of a DeepSpeed checkpoint part: mmengine's, and the
    classes of :data:`DEEPSPEED_CHECKPOINT_CLASSES` that import here."""
    entries = mmengine_checkpoint_globals()
    for module, name in DEEPSPEED_CHECKPOINT_CLASSES:
        try:
            entries.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            continue
    return entries


def load_checkpoint_part(path: str, map_location: Any = None) -> Any:
    """One part of a DeepSpeed checkpoint, loaded with
    ``weights_only=True`` and :func:`deepspeed_checkpoint_globals`.

    Args:
        path (str): The part (``mp_rank_00_model_states.pt``, ...).
        map_location: Same as :func:`torch.load`.

    Raises:
        DeclaredSizeError: The file declares more bytes than it holds.
        UntrustedCheckpointError: The file holds globals or calls outside
            the allowlist; nothing from it was run.
    """
    return load_with_allowlist(
        path, deepspeed_checkpoint_globals(), map_location
    )


def is_needed() -> bool:
    """Whether deepspeed is installed and its engine loads with
    ``weights_only=False``."""
    if importlib.util.find_spec('deepspeed') is None:
        return False
    try:
        engine = importlib.import_module(_ENGINE).TorchCheckpointEngine
    except ImportError:
        return False
    if getattr(engine.load, '_nanguard', False):
        return False
    try:
        return 'weights_only=False' in inspect.getsource(engine.load)
    except (OSError, TypeError):
        return False


def _secure_load(load: Callable) -> Callable:
    @functools.wraps(load)
    def secure(self, path: str, map_location: Any = None) -> Any:
        return load_checkpoint_part(path, map_location=map_location)

    return mark(secure, '_nanguard')


def apply() -> bool:
    """Apply the mend where needed.

    Returns:
        bool: Whether ``TorchCheckpointEngine.load`` was replaced.
    """
    if not is_needed():
        return False
    engine = importlib.import_module(_ENGINE).TorchCheckpointEngine
    engine.load = _secure_load(engine.load)
    return True


__all__ = [
    'DEEPSPEED_CHECKPOINT_CLASSES',
    'apply',
    'deepspeed_checkpoint_globals',
    'is_needed',
    'load_checkpoint_part',
]
