# Copyright (c) mmnanguard contributors. All rights reserved.
"""The names in an incident folder, and the errors of reading one.

Layout: ``{work_dir}/nanguard/incident_{n:03d}_iter{iteration:06d}`` (with
``_rank{r}`` under DDP, where every rank writes its own folder) holds
``report.json`` and ``batch.pth`` (written by
:class:`~mmnanguard.engine.incident.IncidentRecorder` during training) and,
from the diagnosis, ``report.md``, ``timeline.png``, ``config.py`` and
``model.pth`` (written by
:func:`~mmnanguard.engine.incident.write_incident_file`).

Names starting with :data:`TEMP_PREFIX` are unfinished writes: hidden, and
never taken for an incident (they never start with ``incident_``).
"""

import os
import re
import stat
from typing import Optional, Tuple

from mmnanguard.compat.safe_load import UntrustedFileError

REPORT_NAME = 'report.json'
BATCH_NAME = 'batch.pth'
MODEL_NAME = 'model.pth'
CONFIG_NAME = 'config.py'
#: Written into a folder whose incident a resume discarded.
DISCARDED_NAME = 'DISCARDED'
#: ``incident_NNN_iterNNNNNN[_rankR]``: number, iteration, rank.
INCIDENT_DIR_RE = re.compile(
    r'^incident_(\d{3,})_iter(\d{6,})(?:_rank(\d+))?$'
)
#: Temporary files and folders start with it (hidden, never ``incident_``).
TEMP_PREFIX = '.tmp_'
TEMP_DIR_PREFIX = TEMP_PREFIX + 'incident_'


class NotAnIncidentError(ValueError):
    """A folder or file is not what ``NanGuardHook`` writes."""


class UntrustedIncidentError(NotAnIncidentError, UntrustedFileError):
    """An incident file holds objects or calls outside the allowlist."""


class UnsafeIncidentFolderError(NotAnIncidentError):
    """An incident folder is a link, holds one, or is not a folder."""


def parse_folder_name(name: str) -> Optional[Tuple[int, int, Optional[int]]]:
    """``(number, iteration, rank)`` of an incident folder name, or None.

    Args:
        name (str): A base name, e.g. ``'incident_003_iter000012_rank1'``.

    Returns:
        tuple | None: ``rank`` is None without a ``_rank`` suffix.
    """
    match = INCIDENT_DIR_RE.match(name)
    if match is None:
        return None
    rank = match.group(3)
    return (
        int(match.group(1)),
        int(match.group(2)),
        None if rank is None else int(rank),
    )


def describe_entry(path: str) -> str:
    """What ``path`` is, without following it, for an error message.

    Args:
        path (str): A path that is not what was expected.

    Returns:
        str: ``'a symbolic link to ...'``, ``'not a folder'`` or
        ``'unreadable (...)'``.
    """
    try:
        mode = os.lstat(path).st_mode
    except OSError as err:
        return f'unreadable ({err.strerror})'
    if stat.S_ISLNK(mode):
        try:
            return f'a symbolic link to {os.readlink(path)!r}'
        except OSError:
            return 'a symbolic link'
    return 'not a folder'
