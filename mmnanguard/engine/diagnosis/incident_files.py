# Copyright (c) mmnanguard contributors. All rights reserved.
"""Read an incident folder back (for offline replay) and rewrite its report.

An incident folder is data, never code, wherever it comes from.
``batch.pth`` is loaded with ``torch.load(..., weights_only=True)`` and an
exact allowlist (:func:`incident_batch_globals`), in scope for that one
load only: the data classes a batch holds (the mmdet/mmrotate/mmseg data
samples, ``InstanceData``, ``PixelData``, the box and mask types) and what
numpy arrays pickle to; tensors, dicts, lists and tuples are torch's own
defaults. A file that needs anything else is refused with
:class:`UntrustedIncidentError`, naming the file and the global or the
call; nothing from it runs.

The folder-name and ``report.json`` checks of :func:`load_incident` are a
consistency check (is this what ``NanGuardHook`` wrote, of the same
iteration?), not protection: whoever crafts a folder writes those too.
"""

import importlib
import json
import os
import os.path as osp
import re
from typing import Any, Dict, List, Tuple

from mmnanguard.compat.checkpoint_allowlist import numpy_globals
from mmnanguard.compat.safe_load import (
    UntrustedFileError,
    globals_outside,
    scoped_safe_globals,
    weights_only_load,
)

from ..guard.incident import BATCH_NAME, REPORT_NAME

INCIDENT_DIR_RE = re.compile(r'^incident_\d{3}_iter\d{6}(_rank\d+)?$')
INCIDENT_KINDS = (
    'nonfinite_loss',
    'nonfinite_grad',
    'nonfinite_params',
    'nonfinite_checkpoint',
)
#: The data classes a ``batch.pth`` may hold, by module. A package that is
#: not installed contributes none (its classes cannot be in a batch here).
BATCH_CLASSES = (
    ('mmengine.structures', ('InstanceData', 'PixelData')),
    ('mmdet.structures', ('DetDataSample',)),
    ('mmdet.structures.bbox', ('HorizontalBoxes',)),
    ('mmdet.structures.mask', ('BitmapMasks', 'PolygonMasks')),
    ('mmrotate.structures.bbox', ('RotatedBoxes', 'QuadriBoxes')),
    ('mmseg.structures', ('SegDataSample',)),
)


class NotAnIncidentError(ValueError):
    """A folder or file is not what ``NanGuardHook`` writes."""


class UntrustedIncidentError(NotAnIncidentError, UntrustedFileError):
    """An incident file holds objects or calls outside the allowlist."""


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


def check_batch_globals(path: str) -> List[str]:
    """The globals of ``path`` outside :func:`incident_batch_globals`.

    Read without unpickling. A legacy-format file cannot be scanned this
    way; the load itself refuses what it holds.

    Args:
        path (str): A ``batch.pth``.

    Returns:
        list[str]: ``[]`` (raises otherwise).

    Raises:
        UntrustedIncidentError: Naming the file and the foreign globals.
    """
    with scoped_safe_globals(incident_batch_globals()):
        foreign = globals_outside(path)
    if foreign:
        raise UntrustedIncidentError(
            f'Refusing to load the incident batch {path!r}: it references '
            f'globals outside the allowlist: {foreign}'
        )
    return foreign


def load_batch(path: str) -> Dict[str, Any]:
    """Load ``batch.pth`` with ``weights_only=True`` and the allowlist.

    Args:
        path (str): The file.

    Returns:
        dict: What the file holds (checked by :func:`load_incident`).

    Raises:
        UntrustedIncidentError: The unpickler refused a global or a call;
            the message names the file and it.
    """
    return weights_only_load(
        path,
        incident_batch_globals(),
        what='incident batch',
        error=UntrustedIncidentError,
        map_location='cpu',
    )


def load_incident(folder: str) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """``(report, batch)`` of an incident folder, checked before loading.

    Args:
        folder (str): ``.../nanguard/incident_000_iter000012``.

    Returns:
        tuple: The ``report.json`` content and the ``batch.pth`` dict
        (``data_batch``, ``rng_state``, ``iteration``).

    Raises:
        NotAnIncidentError: If the folder name, the report or the batch
            file is not an incident's (a consistency check).
        UntrustedIncidentError: If ``batch.pth`` holds anything outside
            the allowlist (:func:`incident_batch_globals`).
    """
    folder = osp.abspath(folder)
    name = osp.basename(folder.rstrip(os.sep))
    if not INCIDENT_DIR_RE.match(name):
        raise NotAnIncidentError(
            f'{folder} is not an incident folder: expected a name like '
            "'incident_000_iter000012' (written by NanGuardHook)"
        )
    report_path = osp.join(folder, REPORT_NAME)
    batch_path = osp.join(folder, BATCH_NAME)
    for path in (report_path, batch_path):
        if not osp.isfile(path):
            raise NotAnIncidentError(
                f'{folder} has no {osp.basename(path)}'
                ' (NanGuardHook(save_batch=True) '
                'writes it)'
            )
    try:
        with open(report_path) as f:
            report = json.load(f)
    except ValueError as err:  # json.JSONDecodeError, UnicodeDecodeError
        raise NotAnIncidentError(
            f'{report_path} is not an incident report: not JSON ({err})'
        ) from err
    if not isinstance(report, dict):
        raise NotAnIncidentError(
            f'{report_path} is not an incident report: expected a JSON '
            f'object, got {type(report).__name__}'
        )
    if report.get('kind') not in INCIDENT_KINDS or not isinstance(
        report.get('iteration'), int
    ):
        raise NotAnIncidentError(
            f'{report_path} is not an incident report: kind='
            f'{report.get("kind")!r}, expected one of {INCIDENT_KINDS}, '
            f'and an integer iteration (got {report.get("iteration")!r})'
        )
    batch = load_batch(batch_path)
    if not isinstance(batch, dict) or not {
        'data_batch',
        'rng_state',
        'iteration',
    } <= set(batch):
        raise NotAnIncidentError(
            f'{batch_path} is not an incident batch: expected a dict with '
            'data_batch, rng_state and iteration'
        )
    if batch['iteration'] != report['iteration']:
        raise NotAnIncidentError(
            f"{batch_path} is of iteration {batch['iteration']}, its report "
            f"of iteration {report['iteration']}"
        )
    return report, batch


def write_report_json(report: Dict[str, Any], folder: str) -> str:
    """Rewrite ``report.json`` atomically (temporary file, then rename)."""
    path = osp.join(folder, REPORT_NAME)
    tmp = path + '.tmp'
    with open(tmp, 'w') as f:
        json.dump(report, f, indent=2, default=str)
    os.replace(tmp, path)
    return path
