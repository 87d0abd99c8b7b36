# Copyright (c) mmnanguard contributors. All rights reserved.
"""Which checkpoints in a work dir finished and can be loaded.

A checkpoint that a kill or a full disk cut short (mmengine writes it in
place) is a prefix of a zip archive: its central directory, at the end of
the file, is missing. :func:`checkpoint_problem` tells such a file apart
without loading it; with ``load=True`` it also loads it with the project's
secure loader (``weights_only`` and the checkpoint allowlist,
:func:`mmnanguard.compat.checkpoint_allowlist.load_from_local`).

Cost of the checks
------------------
* cheap (``load=False``, what :func:`verified_checkpoints` does for every
  file): one ``stat``, the zip central directory (a few KB at the end of
  the file, one entry per tensor) and the ``data.pkl`` entry (the pickled
  structure without the tensor data, tens to hundreds of KB; its CRC is
  checked and its opcodes are scanned, nothing is unpickled). It grows
  with the number of tensors, not with their size: 14 ms for the 96 MB
  checkpoint of the tiny rotated RetinaNet (ResNet-18 with SGD momentum,
  on a loaded 2-core machine). It catches every truncated or empty file,
  a damaged structure, and an entry that declares more bytes than the file
  can hold (a decompression bomb,
  :mod:`mmnanguard.compat.declared_sizes`), before reading ``data.pkl``;
  it does not read the tensor data, so a flipped bit inside a tensor
  passes.
* full (``load=True``): one secure load of the whole file, what resuming
  costs anyway (0.4 s for the same file). Resuming does it once, for the
  checkpoint it picks; rollback from a checkpoint does it by loading the
  file it picks.

Which files are candidates
--------------------------
The regular files (or, from a strategy that writes every rank's part,
folders: :mod:`.checkpoint_folder`) named ``iter_<n>.pth`` or
``epoch_<n>.pth`` (the names
``CheckpointHook`` and the preemption save write) directly in the work
dir, plus the file that ``<work_dir>/last_checkpoint`` names and the
``iter_/epoch_`` files next to it (``CheckpointHook(out_dir=...)`` saves
elsewhere). ``best_*.pth`` files are left out (they hold no optimizer
state). Newest first means the latest modification time first (a
durable write sets it when the file is complete; the number in the name
breaks ties): after a resume from an older checkpoint the files the
resumed run writes are newer than the ones it left behind, even where
their numbers are lower.
"""

import os
import os.path as osp
import pickle
import pickletools
import re
import stat
import zipfile
from typing import Any, Callable, List, Optional, Set, Tuple

from mmnanguard.compat.checkpoint_allowlist import load_from_local
from mmnanguard.compat.declared_sizes import size_problem
from mmnanguard.compat.deepspeed_checkpoint_load import load_checkpoint_part

from .checkpoint_folder import checkpoint_parts

#: The names of the checkpoints that are candidates.
CHECKPOINT_NAME = re.compile(r'^(?:iter|epoch)_(\d+)\.pth$')
#: The file in which mmengine names the latest checkpoint.
LAST_CHECKPOINT = 'last_checkpoint'
#: What a load of a damaged or refused checkpoint raises (the secure
#: loader's ``UntrustedCheckpointError`` is a ``pickle.UnpicklingError``).
LOAD_ERRORS = (
    OSError,
    RuntimeError,
    EOFError,
    ValueError,
    TypeError,
    KeyError,
    AttributeError,
    IndexError,
    zipfile.BadZipFile,
    pickle.UnpicklingError,
)
#: The keys every mmengine checkpoint has.
REQUIRED_KEYS = ('meta', 'state_dict')
#: The keys of the part of a checkpoint folder that holds the run's state
#: (``FlexibleRunner`` hands them to every strategy; DeepSpeed keeps the
#: weights under ``module``).
FOLDER_KEYS = ('meta', 'message_hub')


def _one_line(err: BaseException) -> str:
    text = ' '.join(str(err).split()) or repr(err)
    return f'{type(err).__name__}: {text[:300]}'


def _structure_problem(
    path: str, size: int, required: Tuple[str, ...] = REQUIRED_KEYS
) -> Optional[str]:
    """The cheap check: zip central directory and ``data.pkl``, which
    names every key of ``required``."""
    problem, strings = _read_structure(path, size)
    if problem is not None:
        return problem
    missing = [key for key in required if key not in strings]
    if missing:
        return f'it has no {missing} (not an mmengine checkpoint)'
    return None


def _read_structure(path: str, size: int) -> Tuple[Optional[str], Set[str]]:
    """Why ``path`` is no complete ``torch.save`` zip, or the strings its
    ``data.pkl`` holds (read without unpickling)."""
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile as err:
        return (
            'it is not a complete zip archive (cut short by a kill or a '
            f'full disk, or not a torch.save file): {err}'
        ), set()
    except (OSError, RuntimeError, ValueError, EOFError) as err:
        return f'its zip structure cannot be read: {_one_line(err)}', set()
    with archive:
        infos = archive.infolist()
        problem = size_problem(path)
        if problem is not None:
            return problem, set()
        pickles = [i for i in infos if i.filename.endswith('/data.pkl')]
        if len(pickles) != 1:
            return 'it holds no data.pkl entry (not a torch.save file)', set()
        for info in infos:
            if info.header_offset + info.compress_size > size:
                return (
                    f'its entry {info.filename!r} ends past the end of the '
                    'file'
                ), set()
        try:
            data = archive.read(pickles[0])  # checks the CRC
        except (zipfile.BadZipFile, OSError, RuntimeError, EOFError) as err:
            return f'its data.pkl is damaged: {_one_line(err)}', set()
    strings = set()
    try:
        for opcode, arg, _ in pickletools.genops(data):
            if 'UNICODE' in opcode.name and isinstance(arg, str):
                strings.add(arg)
    except (ValueError, EOFError, KeyError) as err:
        return f'its data.pkl is damaged: {_one_line(err)}', set()
    return None, strings


def _load_problem(
    path: str,
    required: Tuple[str, ...] = REQUIRED_KEYS,
    load: Callable[..., Any] = load_from_local,
) -> Optional[str]:
    """The full check: one secure load."""
    try:
        checkpoint = load(path, map_location='cpu')
    except LOAD_ERRORS as err:
        return f'it does not load: {_one_line(err)}'
    if not isinstance(checkpoint, dict):
        return f'it holds a {type(checkpoint).__name__}, not a dict'
    missing = [key for key in required if key not in checkpoint]
    if missing:
        return f'it has no {missing} (not an mmengine checkpoint)'
    meta = checkpoint['meta']
    if not isinstance(meta, dict) or not {'epoch', 'iter'} <= set(meta):
        return "its 'meta' has no 'epoch' and 'iter'"
    return None


def checkpoint_problem(path: str, load: bool = False) -> Optional[str]:
    """Why ``path`` is not a usable checkpoint; None when it is.

    Args:
        path (str): A checkpoint file.
        load (bool): Also load it with the secure loader (see the module
            docstring for the cost). Defaults to False.

    Returns:
        str | None: The reason, a phrase such as ``'it is empty'`` (to
        follow the file name in a message), or None.
    """
    if not path:
        return 'no file is named'
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return 'it does not exist'
    except OSError as err:
        return f'it cannot be read: {_one_line(err)}'
    if stat.S_ISDIR(os.lstat(path).st_mode):
        return _folder_problem(path, load)
    if not stat.S_ISREG(info.st_mode):
        return 'it is not a regular file'
    if info.st_size == 0:
        return 'it is empty'
    problem = _structure_problem(path, info.st_size)
    if problem is None and load:
        problem = _load_problem(path)
    return problem


def _folder_problem(path: str, load: bool) -> Optional[str]:
    """:func:`checkpoint_problem` of a folder that every rank wrote a part
    of (DeepSpeed, FSDP1 local): every part a complete ``torch.save``
    file, one of them holding the run's state (:data:`FOLDER_KEYS`)."""
    problem, parts = checkpoint_parts(path)
    if problem is not None:
        return problem
    holder = None
    for part in parts:
        name, size = osp.basename(part), os.stat(part).st_size
        if size == 0:
            return f'its part {name!r} is empty'
        problem, strings = _read_structure(part, size)
        if problem is not None:
            return f'its part {name!r}: {problem}'
        if holder is None and all(key in strings for key in FOLDER_KEYS):
            holder = part
    if holder is None:
        return f'none of its parts holds {list(FOLDER_KEYS)}'
    if load:
        problem = _load_problem(holder, FOLDER_KEYS, load_checkpoint_part)
        if problem is not None:
            return f'its part {osp.basename(holder)!r}: {problem}'
    return None


def truncation_problem(path: str) -> Optional[str]:
    """Why ``path`` is a cut-short file; None otherwise.

    Only what any ``torch.save`` file must satisfy is checked (a weights
    file for ``load_from`` may be a plain state dict, or in torch's legacy
    format): not empty, and a zip archive (it starts with ``PK``) whose
    central directory is there and whose entries declare no more bytes
    than the file holds, or a legacy-format file whose storages declare
    no more bytes than it holds (:mod:`mmnanguard.compat.declared_sizes`).

    Args:
        path (str): A local file.

    Returns:
        str | None: The reason, or None (also for a missing file, which
        mmengine reports itself).
    """
    try:
        if os.path.getsize(path) == 0:
            return 'it is empty'
        with open(path, 'rb') as f:
            magic = f.read(4)
    except OSError:
        return None
    if magic != b'PK\x03\x04':  # a legacy-format file is checked too
        return size_problem(path)
    try:
        with zipfile.ZipFile(path):
            pass
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as err:
        return (
            'it is not a complete zip archive (cut short by a kill or a '
            f'full disk): {err}'
        )
    return size_problem(path)


def read_last_checkpoint(folder: str) -> Tuple[bool, str]:
    """Read ``<folder>/last_checkpoint``.

    Args:
        folder (str): The work dir.

    Returns:
        tuple[bool, str]: Whether the file exists, and the path it names
        (stripped; ``''`` when it is empty, unreadable or not a regular
        file).
    """
    marker = osp.join(folder, LAST_CHECKPOINT)
    try:
        info = os.lstat(marker)
    except OSError:
        return False, ''
    if not stat.S_ISREG(info.st_mode) or info.st_size > 64 * 1024:
        return True, ''
    try:
        with open(marker, encoding='utf-8', errors='replace') as f:
            return True, f.read().strip()
    except OSError:
        return True, ''


def _numbered_files(folder: str) -> List[str]:
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    found = []
    for name in names:
        if not CHECKPOINT_NAME.match(name):
            continue
        path = osp.join(folder, name)
        try:
            mode = os.lstat(path).st_mode  # a link is no candidate
            if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
                found.append(path)
        except OSError:
            continue
    return found


def _newest_first_key(path: str) -> Tuple[int, int]:
    match = CHECKPOINT_NAME.match(osp.basename(path))
    number = int(match.group(1)) if match else -1
    try:
        mtime = os.stat(path).st_mtime_ns
    except OSError:
        mtime = -1
    return mtime, number


def candidate_checkpoints(work_dir: str) -> List[str]:
    """Every candidate checkpoint of ``work_dir``, newest first, unchecked.

    Args:
        work_dir (str): The run's work dir.

    Returns:
        list[str]: See the module docstring for which files.
    """
    _, named = read_last_checkpoint(work_dir)
    paths = _numbered_files(work_dir)
    if named and is_local_path(named):
        paths.append(named)
        folder = osp.dirname(named)
        if folder and osp.realpath(folder) != osp.realpath(work_dir):
            paths += _numbered_files(folder)
    unique, seen = [], set()
    for path in paths:
        key = osp.realpath(path)
        if key not in seen and osp.exists(path):
            seen.add(key)
            unique.append(path)
    return sorted(unique, key=_newest_first_key, reverse=True)


def is_local_path(path: str) -> bool:
    """Whether ``path`` has no ``scheme://`` prefix."""
    return '://' not in path


def verified_checkpoints(work_dir: str) -> List[str]:
    """The checkpoints of ``work_dir`` that finished and verify, newest
    first.

    Each is checked with the cheap check of :func:`checkpoint_problem`
    (zip central directory and ``data.pkl``: milliseconds a file, see the
    module docstring).
    A file can still fail to load (a tensor damaged on disk, a global
    outside the allowlist): a caller that loads one catches
    :data:`LOAD_ERRORS` and goes on with the next.

    Args:
        work_dir (str): The run's work dir (``runner.work_dir``).

    Returns:
        list[str]: Paths, newest first; ``[]`` when there is none.

    Example:
        >>> for path in verified_checkpoints(runner.work_dir):
        ...     try:
        ...         state = load_from_local(path, map_location='cpu')
        ...     except LOAD_ERRORS:
        ...         continue
        ...     break
    """
    return [
        path
        for path in candidate_checkpoints(work_dir)
        if checkpoint_problem(path) is None
    ]


__all__ = [
    'CHECKPOINT_NAME',
    'LAST_CHECKPOINT',
    'LOAD_ERRORS',
    'candidate_checkpoints',
    'checkpoint_problem',
    'is_local_path',
    'read_last_checkpoint',
    'truncation_problem',
    'verified_checkpoints',
]
