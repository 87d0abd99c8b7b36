# Copyright (c) mmnanguard contributors. All rights reserved.
"""Read an incident folder back: links refused, the report checked.

An incident folder is data, never code, wherever it comes from. A folder
that is a link or holds a link is refused
(:class:`UnsafeIncidentFolderError`). ``report.json`` must be a regular
file of bounded size holding a JSON object; ``batch.pth`` is loaded as
data with an allowlist (:mod:`.allowlist`). Every error names the file.

The folder-name and ``report.json`` checks of :func:`load_incident` are a
consistency check (is this what ``NanGuardHook`` wrote, of the same
iteration?), not protection: whoever crafts a folder writes those too.
"""

import errno
import json
import os
import os.path as osp
import stat
from typing import Any, Dict, List, Optional, Tuple

from .allowlist import load_batch
from .kinds import IncidentKind
from .names import (
    BATCH_NAME,
    INCIDENT_DIR_RE,
    REPORT_NAME,
    TEMP_DIR_PREFIX,
    TEMP_PREFIX,
    NotAnIncidentError,
    UnsafeIncidentFolderError,
    describe_entry,
)

#: ``report.json`` larger than this is refused (a real one is kilobytes).
MAX_REPORT_BYTES = 64 * 1024 * 1024
_READ_FLAGS = (
    os.O_RDONLY
    | getattr(os, 'O_NOFOLLOW', 0)
    | getattr(os, 'O_NONBLOCK', 0)  # a FIFO must not block the open
    | getattr(os, 'O_CLOEXEC', 0)
)


def linked_entries(folder: str) -> List[str]:
    """The paths in ``folder`` (the folder itself included) that are links.

    Args:
        folder (str): A folder.

    Returns:
        list[str]: The links, sorted; ``[]`` when there is none.
    """
    if osp.islink(folder):
        return [folder]
    try:
        with os.scandir(folder) as entries:
            return sorted(e.path for e in entries if e.is_symlink())
    except (FileNotFoundError, NotADirectoryError):
        return []


def refuse_links(folder: str) -> None:
    """Raise when ``folder`` is a link or holds one.

    Raises:
        UnsafeIncidentFolderError: Naming the first link and its target.
    """
    links = linked_entries(folder)
    if links:
        raise UnsafeIncidentFolderError(
            f'nanguard: refusing the incident folder {folder}: '
            f'{links[0]} is {describe_entry(links[0])} '
            f'({len(links)} link(s) in all). NanGuardHook writes no links; '
            'an incident folder that holds one is not read, and nothing '
            'is written through it'
        )


def _read_regular(
    path: str, limit: int, dir_fd: Optional[int] = None
) -> bytes:
    """The bytes of ``path``, a regular file (not a link) of at most
    ``limit`` bytes.

    Args:
        path (str): The file.
        limit (int): The most bytes it may have.
        dir_fd (int, optional): A descriptor of ``path``'s folder: the
            file is opened by its base name relative to it (no link on
            the way is followed). Defaults to None (``path`` as it is).

    Raises:
        NotAnIncidentError: It is a link, not a regular file, larger than
            ``limit``, or unreadable; naming the file.
    """
    try:
        if dir_fd is None:
            fd = os.open(path, _READ_FLAGS)
        else:
            fd = os.open(osp.basename(path), _READ_FLAGS, dir_fd=dir_fd)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise UnsafeIncidentFolderError(
                f'nanguard: refusing {path}: it is '
                f'{describe_entry(path)}; expected a regular file'
            ) from err
        raise NotAnIncidentError(
            f'nanguard: cannot read {path}: {err.strerror or err}'
        ) from err
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotAnIncidentError(
                f'nanguard: refusing {path}: it is not a regular file '
                f'(mode {stat.filemode(info.st_mode)})'
            )
        if info.st_size > limit:
            raise NotAnIncidentError(
                f'nanguard: refusing {path}: {info.st_size} bytes, more '
                f'than the {limit} an incident report may have'
            )
        with os.fdopen(os.dup(fd), 'rb') as f:
            data = f.read(limit + 1)
    except OSError as err:
        raise NotAnIncidentError(
            f'nanguard: cannot read {path}: {err.strerror or err}'
        ) from err
    finally:
        os.close(fd)
    if len(data) > limit:
        raise NotAnIncidentError(
            f'nanguard: refusing {path}: more than {limit} bytes'
        )
    return data


def load_report(folder: str, dir_fd: Optional[int] = None) -> Dict[str, Any]:
    """``report.json`` of an incident folder, as a dict.

    Args:
        folder (str): The incident folder.
        dir_fd (int, optional): A descriptor of ``folder`` (opened with
            ``O_NOFOLLOW``): the report is read relative to it. Defaults
            to None (read by path).

    Returns:
        dict: The report (not checked beyond being a JSON object; see
        :func:`check_report`).

    Raises:
        NotAnIncidentError: The file is missing, a link, not a regular
            file, too large, not JSON, nested too deep or not an object;
            the message names it.
    """
    path = osp.join(folder, REPORT_NAME)
    data = _read_regular(path, MAX_REPORT_BYTES, dir_fd)
    try:
        report = json.loads(data.decode('utf-8'))
    except ValueError as err:  # json.JSONDecodeError, UnicodeDecodeError
        raise NotAnIncidentError(
            f'{path} is not an incident report: not JSON ({err})'
        ) from err
    except RecursionError as err:
        raise NotAnIncidentError(
            f'{path} is not an incident report: it is nested deeper than '
            'the JSON reader allows (an incident report is a few levels '
            'deep)'
        ) from err
    if not isinstance(report, dict):
        raise NotAnIncidentError(
            f'{path} is not an incident report: expected a JSON '
            f'object, got {type(report).__name__}'
        )
    return report


#: Optional report fields read as data by the diagnosis, and their types.
_FIELD_TYPES = {
    'epoch': (int, type(None)),
    'rank': (int, type(None)),
    'action': (str, type(None)),
    'loss_scale': (int, float, type(None)),
    'lr': (int, float, str, dict, type(None)),
    'grad_norm': (int, float, str, type(None)),
    'nonfinite_terms': (dict,),
    'history': (list,),
    'samples': (list,),
    'live': (dict, type(None)),
    'stage': (str, type(None)),
}


#: A report nested deeper than this is refused (a real one has about 6).
MAX_REPORT_DEPTH = 32


def _depth(value: Any) -> int:
    """Nesting depth of lists and dicts in ``value`` (iterative)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, depth)
            if depth <= MAX_REPORT_DEPTH:
                stack.extend((v, depth + 1) for v in item)
    return deepest


def check_report(report: Dict[str, Any], path: str) -> None:
    """Check that ``report`` is what ``NanGuardHook`` writes.

    Every :class:`IncidentKind` is accepted; ``iteration`` must be an
    integer, the fields the diagnosis reads have their types, and the
    report is nested at most :data:`MAX_REPORT_DEPTH` deep.

    Raises:
        NotAnIncidentError: Naming the file, the field, its value and the
            expected form.
    """
    if _depth(report) > MAX_REPORT_DEPTH:
        raise NotAnIncidentError(
            f'{path} is not an incident report: it is nested more than '
            f'{MAX_REPORT_DEPTH} levels deep (an incident report has a few)'
        )
    kind = IncidentKind.parse(report.get('kind'))
    iteration = report.get('iteration')
    if (
        kind is None
        or not isinstance(iteration, int)
        or isinstance(iteration, bool)
    ):
        kinds = tuple(k.value for k in IncidentKind)
        raise NotAnIncidentError(
            f'{path} is not an incident report: kind='
            f'{report.get("kind")!r}, expected one of {kinds}, '
            f'and an integer iteration (got {iteration!r})'
        )
    for key, types in _FIELD_TYPES.items():
        if key in report and not isinstance(report[key], types):
            names = ' or '.join(t.__name__ for t in types)
            raise NotAnIncidentError(
                f'{path} is not an incident report: {key}='
                f'{_short(report[key])} is of type '
                f'{type(report[key]).__name__}; expected {names}'
            )
    for key in ('history', 'samples'):
        for entry in report.get(key, []):
            if not isinstance(entry, dict) or (
                key == 'history'
                and not isinstance(entry.get('iteration'), int)
            ):
                raise NotAnIncidentError(
                    f'{path} is not an incident report: an entry of {key} '
                    f'is {_short(entry)}; expected an object'
                    + (
                        ' with an integer iteration'
                        if key == 'history'
                        else ''
                    )
                )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + '...'


def _leftovers(folder: str) -> List[str]:
    """Temporary files an interrupted write left in ``folder``."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return sorted(
        n for n in names if n.startswith(TEMP_PREFIX) or n.endswith('.tmp')
    )


def _missing(folder: str, name: str, hint: str) -> NotAnIncidentError:
    leftovers = _leftovers(folder)
    if leftovers:
        return NotAnIncidentError(
            f'nanguard: {folder} has no {name}, only the unfinished '
            f'temporary file(s) {leftovers}: writing this incident was '
            'interrupted (a kill, a crash or a full disk) before it was '
            'complete; the folder holds no usable incident'
        )
    return NotAnIncidentError(f'{folder} has no {name} ({hint})')


def load_incident(folder: str) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """``(report, batch)`` of an incident folder, checked before loading.

    Args:
        folder (str): ``.../nanguard/incident_000_iter000012``.

    Returns:
        tuple: The ``report.json`` content and the ``batch.pth`` dict
        (``data_batch``, ``rng_state``, ``iteration``).

    Raises:
        UnsafeIncidentFolderError: The folder is a link or holds one.
        NotAnIncidentError: If the folder name, the report or the batch
            file is not an incident's (a consistency check), or a file is
            truncated; the message names the file.
        UntrustedIncidentError: If ``batch.pth`` holds anything outside
            the allowlist (:func:`incident_batch_globals`).
    """
    folder = osp.abspath(folder)
    name = osp.basename(folder)
    refuse_links(folder)
    if name.startswith(TEMP_DIR_PREFIX):
        raise NotAnIncidentError(
            f'nanguard: {folder} is an unfinished incident folder: writing '
            'it was interrupted (a kill, a crash or a full disk) before it '
            'was complete and renamed; it holds no usable incident'
        )
    if not INCIDENT_DIR_RE.match(name):
        raise NotAnIncidentError(
            f'{folder} is not an incident folder: expected a name like '
            "'incident_000_iter000012' (written by NanGuardHook)"
        )
    if not osp.isdir(folder):
        raise NotAnIncidentError(f'{folder} is not a folder')
    report_path = osp.join(folder, REPORT_NAME)
    batch_path = osp.join(folder, BATCH_NAME)
    if not osp.lexists(report_path):
        raise _missing(folder, REPORT_NAME, 'NanGuardHook writes it')
    report = load_report(folder)
    check_report(report, report_path)
    if not osp.lexists(batch_path):
        raise _missing(
            folder, BATCH_NAME, 'NanGuardHook(save_batch=True) writes it'
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
            f"{batch_path} is of iteration {batch['iteration']!r}, its "
            f"report of iteration {report['iteration']}"
        )
    return report, batch
