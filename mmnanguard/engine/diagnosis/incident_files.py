# Copyright (c) mmnanguard contributors. All rights reserved.
"""Read an incident folder back (for offline replay) and rewrite its report.

``batch.pth`` holds mmengine data samples (``DetDataSample``,
``InstanceData``, box types), which only a full unpickler can load:
``torch.load(..., weights_only=False)`` can run arbitrary code from a
crafted file. :func:`load_incident` therefore loads it only after checking
that it is an incident file: the folder is named like the ones
``NanGuardHook`` writes, its ``report.json`` is an incident report of the
same iteration, and every global the pickle references lies in the
OpenMMLab, torch or numpy packages (read off without executing it with
``torch.serialization.get_unsafe_globals_in_checkpoint``). Load incident
folders from people you trust all the same.
"""

import json
import os
import os.path as osp
import re
from typing import Any, Dict, List, Tuple

import torch

from ..guard.incident import BATCH_NAME, REPORT_NAME

INCIDENT_DIR_RE = re.compile(r'^incident_\d{3}_iter\d{6}(_rank\d+)?$')
INCIDENT_KINDS = (
    'nonfinite_loss',
    'nonfinite_grad',
    'nonfinite_params',
    'nonfinite_checkpoint',
)
#: Module prefixes whose globals a ``batch.pth`` may reference.
SAFE_GLOBAL_PREFIXES = (
    'mmengine.',
    'mmcv.',
    'mmdet.',
    'mmrotate.',
    'mmseg.',
    'mmnanguard.',
    'torch.',
    'numpy.',
    'collections.',
    '_codecs.encode',
    'builtins.set',
    'builtins.slice',
    'builtins.frozenset',
)


class NotAnIncidentError(ValueError):
    """A folder or file is not what ``NanGuardHook`` writes."""


def check_batch_globals(path: str) -> List[str]:
    """The globals ``path`` references; raise if one is outside
    :data:`SAFE_GLOBAL_PREFIXES`.

    Raises:
        NotAnIncidentError: Naming the file and the foreign globals.
    """
    found = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    foreign = [g for g in found if not g.startswith(SAFE_GLOBAL_PREFIXES)]
    if foreign:
        raise NotAnIncidentError(
            f'{path} references globals outside the OpenMMLab/torch/numpy '
            f'packages: {foreign}; refusing to unpickle it'
        )
    return found


def load_incident(folder: str) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """``(report, batch)`` of an incident folder, checked before loading.

    Args:
        folder (str): ``.../nanguard/incident_000_iter000012``.

    Returns:
        tuple: The ``report.json`` content and the ``batch.pth`` dict
        (``data_batch``, ``rng_state``, ``iteration``).

    Raises:
        NotAnIncidentError: If the folder name, the report or the batch
            file is not an incident's.
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
    with open(report_path) as f:
        report = json.load(f)
    if report.get('kind') not in INCIDENT_KINDS or not isinstance(
        report.get('iteration'), int
    ):
        raise NotAnIncidentError(
            f'{report_path} is not an incident report: kind='
            f'{report.get("kind")!r}, expected one of {INCIDENT_KINDS}'
        )
    check_batch_globals(batch_path)
    batch = torch.load(batch_path, map_location='cpu', weights_only=False)
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
