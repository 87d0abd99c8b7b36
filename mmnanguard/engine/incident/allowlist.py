# Copyright (c) mmnanguard contributors. All rights reserved.
"""The allowlist of incident files, and the loads of ``batch.pth`` and
``model.pth``.

An incident folder is data, never code, wherever it comes from.
``batch.pth`` and ``model.pth`` are loaded with
``torch.load(..., weights_only=True)`` and an exact allowlist
(:func:`incident_batch_globals`), in scope for that one load only: the
data classes a batch holds (the mmdet/mmrotate/mmseg data samples,
``InstanceData``, ``LabelData``, ``PixelData``, the box and mask types;
the data classes of any other installed OpenMMLab toolbox, admitted by
what they are: :mod:`.toolbox_data_classes`) and what numpy arrays
pickle to; tensors, dicts, lists and tuples are torch's own
defaults. ``model.pth`` gets no entry beyond those defaults. A file that
needs anything else is refused with :class:`UntrustedIncidentError`,
naming the file and the global or the call; nothing from it runs. A file
whose zip entries declare more bytes than it holds (a decompression
bomb) is refused before torch's reader allocates them
(:mod:`mmnanguard.compat.declared_sizes`). Every error names the file.
"""

import importlib
import os.path as osp
import pickle
import zipfile
from typing import Any, Dict, List, Optional, Tuple

import torch

from mmnanguard.compat.checkpoint_allowlist import numpy_globals
from mmnanguard.compat.declared_sizes import DeclaredSizeError
from mmnanguard.compat.safe_load import (
    UntrustedFileError,
    globals_outside,
    scoped_safe_globals,
    weights_only_load,
)

from .names import (
    NotAnIncidentError,
    UnsafeIncidentFolderError,
    UntrustedIncidentError,
    describe_entry,
)
from .toolbox_data_classes import admitted_data_classes

#: The data classes a ``batch.pth`` may hold, by module. A package that is
#: not installed contributes none (its classes cannot be in a batch here).
BATCH_CLASSES = (
    ('mmengine.structures', ('InstanceData', 'LabelData', 'PixelData')),
    ('mmdet.structures', ('DetDataSample',)),
    ('mmdet.structures.bbox', ('HorizontalBoxes',)),
    ('mmdet.structures.mask', ('BitmapMasks', 'PolygonMasks')),
    ('mmrotate.structures.bbox', ('RotatedBoxes', 'QuadriBoxes')),
    ('mmseg.structures', ('SegDataSample',)),
)


def incident_batch_globals() -> List[Any]:
    """The allowlist of ``batch.pth``: data classes and numpy, no callable.

    Returns:
        list: Entries for ``torch.serialization.safe_globals``.
    """
    found: List[Any] = []
    for module_name, names in BATCH_CLASSES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        found += [getattr(module, name) for name in names]
    return found + numpy_globals()


def batch_globals(path: str) -> List[Any]:
    """The allowlist of the ``batch.pth`` at ``path``:
    :func:`incident_batch_globals` and the data classes of installed
    OpenMMLab toolboxes that the file names
    (:mod:`.toolbox_data_classes`).

    Args:
        path (str): A ``batch.pth``.

    Returns:
        list: Entries for ``torch.serialization.safe_globals``.
    """
    return _scan_batch_globals(path)[0]


def _scan_batch_globals(path: str) -> Tuple[List[Any], List[str]]:
    """One scan of ``path``: its allowlist (:func:`batch_globals`) and the
    globals it names outside that allowlist."""
    fixed = incident_batch_globals()
    with scoped_safe_globals(fixed):
        foreign = globals_outside(path)
    admitted = admitted_data_classes(foreign)
    refused = [name for name in foreign if name not in admitted]
    return fixed + list(admitted.values()), refused


def check_batch_globals(path: str) -> List[str]:
    """The globals of ``path`` outside :func:`batch_globals`.

    Read without unpickling. A legacy-format file cannot be scanned this
    way; the load itself refuses what it holds.

    Args:
        path (str): A ``batch.pth``.

    Returns:
        list[str]: ``[]`` (raises otherwise).

    Raises:
        UntrustedIncidentError: Naming the file and the foreign globals.
    """
    foreign = _scan_batch_globals(path)[1]
    if foreign:
        raise UntrustedIncidentError(
            f'Refusing to load the incident batch {path!r}: it references '
            f'globals outside the allowlist: {foreign}'
        )
    return foreign


def replay_refusal(batch_path: str) -> Optional[str]:
    """Why offline replay would refuse ``batch_path``, or None.

    ``batch.pth`` is read back with ``weights_only=True`` and an allowlist
    of data classes; a batch holding anything else (say, a custom object
    in a dataset's metainfo) is refused. This says so when the file is
    written, not when someone replays it.

    Args:
        batch_path (str): A ``batch.pth`` just written.

    Returns:
        str | None: The refusal, naming the file and the globals outside
        the allowlist; None when replay will load the file.
    """
    try:
        check_batch_globals(batch_path)
    except UntrustedIncidentError as err:
        return str(err)
    return None


def _load_data_file(
    path: str, entries: List[Any], what: str, error: type
) -> Any:
    """``weights_only`` load of an incident file; every error names it."""
    try:
        return weights_only_load(
            path, entries, what=what, error=error, map_location='cpu'
        )
    except UntrustedFileError:
        raise
    except DeclaredSizeError as err:  # names the file and the entry
        raise NotAnIncidentError(str(err)) from err
    except (
        RuntimeError,
        EOFError,
        OSError,
        ValueError,
        pickle.UnpicklingError,
        zipfile.BadZipFile,
    ) as err:
        raise NotAnIncidentError(
            f'nanguard: cannot load the {what} {path}: it is not a '
            f'complete torch file (truncated by a kill or a full disk, or '
            f'not written by NanGuard): {type(err).__name__}: {err}'
        ) from err
    except RecursionError as err:
        raise NotAnIncidentError(
            f'nanguard: cannot load the {what} {path}: it is nested '
            'deeper than Python can unpickle'
        ) from err


#: ``BaseDataElement`` attributes that are state, not fields.
_ELEMENT_STATE = frozenset(('_metainfo_fields', '_data_fields'))


def check_data_elements(batch: Any, path: str) -> None:
    """Refuse a data element whose fields shadow its class's attributes.

    A pickled ``DetDataSample`` (or any ``BaseDataElement``) is restored
    by setting its ``__dict__``: a field named ``to`` or ``keys`` would
    replace the method for that object, and the replay would fail far
    from the file with a ``TypeError``.

    Args:
        batch: The loaded ``batch.pth``.
        path (str): Its path, for the message.

    Raises:
        NotAnIncidentError: Naming the file, the class and the field.
    """
    from mmengine.structures import BaseDataElement

    stack, seen = [batch], 0
    while stack:
        obj = stack.pop()
        seen += 1
        if seen > 1_000_000:
            raise NotAnIncidentError(
                f'nanguard: {path} holds more than a million objects; an '
                'incident batch holds one batch'
            )
        if isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
        elif isinstance(obj, BaseDataElement):
            cls = type(obj)
            for key, value in vars(obj).items():
                if key not in _ELEMENT_STATE and hasattr(cls, key):
                    raise NotAnIncidentError(
                        f'nanguard: refusing {path}: a {cls.__name__} in it '
                        f'has a field {key!r} that shadows '
                        f'{cls.__name__}.{key}; expected data fields only'
                    )
                stack.append(value)


def load_batch(path: str) -> Dict[str, Any]:
    """Load ``batch.pth`` with ``weights_only=True`` and the allowlist.

    Args:
        path (str): The file.

    Returns:
        dict: What the file holds (checked by :func:`load_incident`).

    Raises:
        UntrustedIncidentError: The unpickler refused a global or a call;
            the message names the file and it.
        NotAnIncidentError: The file is truncated or not a torch file, or
            a data element in it shadows its class; naming the file.
    """
    batch = _load_data_file(
        path,
        batch_globals(path),
        'incident batch',
        UntrustedIncidentError,
    )
    check_data_elements(batch, path)
    return batch


def load_model_state(path: str) -> Dict[str, torch.Tensor]:
    """``model.pth``: a plain state dict, loaded as data only.

    Args:
        path (str): The file.

    Returns:
        dict: Parameter and buffer names to tensors.

    Raises:
        FileNotFoundError: There is no such file.
        UntrustedIncidentError: It holds anything beyond tensors in dicts.
        NotAnIncidentError: It is a link, truncated, or not a dict of
            tensors; naming the file.
    """
    if osp.islink(path):
        raise UnsafeIncidentFolderError(
            f'nanguard: refusing {path}: it is {describe_entry(path)}'
        )
    if not osp.isfile(path):
        raise FileNotFoundError(
            f'{path} does not exist (NanDiagnosisHook(save_model=True) '
            'writes it): pass --checkpoint CKPT'
        )
    state = _load_data_file(path, [], 'model state', UntrustedIncidentError)
    if not isinstance(state, dict) or not all(
        isinstance(v, torch.Tensor) for v in state.values()
    ):
        raise NotAnIncidentError(
            f'{path} is not a model state dict: expected a dict of '
            'tensors (what NanDiagnosisHook writes)'
        )
    return state
