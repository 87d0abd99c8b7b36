# Copyright (c) mmnanguard contributors. All rights reserved.
"""Refuse a ``torch.save`` file whose declared sizes exceed what it holds.

torch's zip reader allocates each record at the uncompressed size its zip
entry declares before it reads a byte, and so does Python's ``zipfile``
for ``data.pkl``: a 16 MB file with a deflated entry of zeros that
declares 16 GiB makes either allocate 16 GiB. :func:`size_problem` reads
the zip central directory only (a few KB at the end of the file, one
entry per tensor) and compares the declared sizes with the file's own:

* ``torch.save`` stores every entry uncompressed, so no entry declares
  more bytes than the whole file has;
* no entry inflates more than :data:`MAX_INFLATION` times its stored
  bytes (a stored entry: once);
* all entries together declare at most :data:`MAX_INFLATION` times the
  file's size (entries that share their stored bytes, the overlapping
  kind of bomb, add up).

A file that passes takes at most :data:`MAX_INFLATION` times its own size
to read. The check takes milliseconds and reads nothing but the central
directory. A file in torch's legacy (non-zip) format has no directory:
its pickles are read without loading anything, and the storages they
declare may not add up to more bytes than the file has
(:mod:`.legacy_declared_sizes`). Any other file (a truncated one) is left
to the loader, which names it.

:func:`check_declared_sizes` raises :class:`DeclaredSizeError` (a
``ValueError``) naming the file, the entry and both sizes.
:func:`~.safe_load.weights_only_load` calls it before every load.
"""

import os
import stat
import zipfile
from typing import Any, Optional

from .legacy_declared_sizes import legacy_declared_bytes

#: How many times its stored bytes an entry may inflate to, and the whole
#: archive its own size (``torch.save``: exactly once).
MAX_INFLATION = 4


class DeclaredSizeError(ValueError):
    """A file declares more bytes than it can hold: a decompression bomb
    or a damaged file. Nothing was read from it."""


def _size_of(file: Any) -> Optional[int]:
    """The size of a regular file (by path) or of a seekable buffer; None
    otherwise (a FIFO or a device is left to the loader, never opened
    here)."""
    if isinstance(file, (str, os.PathLike)):
        info = os.stat(file)
        return info.st_size if stat.S_ISREG(info.st_mode) else None
    try:
        position = file.tell()
        size = file.seek(0, os.SEEK_END)
        file.seek(position)
    except (AttributeError, OSError, ValueError):
        return None
    return size


def human(size: int) -> str:
    """``size`` bytes as ``'16.0 GiB'`` (``'512 bytes'`` below a KiB)."""
    value, units = float(size), ['bytes', 'KiB', 'MiB', 'GiB', 'TiB']
    while value >= 1024 and len(units) > 1:
        value /= 1024
        units.pop(0)
    if units[0] == 'bytes':
        return f'{size} bytes'
    return f'{value:.1f} {units[0]}'


def size_problem(file: Any) -> Optional[str]:
    """Why ``file``'s declared sizes are not those of a ``torch.save`` file,
    as a phrase to follow its name; None when they are (or when it is
    neither a zip archive nor a legacy-format file: the loader reports
    it).

    Args:
        file (str | file-like): A path, or a seekable binary buffer.

    Returns:
        str | None: E.g. ``"its entry 'archive/data.pkl' declares 16.0 GiB
        uncompressed, more than the 16.0 MiB of the whole file ..."``.
    """
    size = _size_of(file)
    if size is None:
        return None
    position = None if isinstance(file, (str, os.PathLike)) else file.tell()
    try:
        with zipfile.ZipFile(file) as archive:
            infos = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return _legacy_problem(file, size)
    finally:
        if position is not None:
            file.seek(position)
    total = 0
    for info in infos:
        total += info.file_size
        if info.file_size > size:
            return (
                f'its entry {info.filename!r} declares '
                f'{human(info.file_size)} uncompressed, more than the '
                f'{human(size)} of the whole file (torch.save stores its '
                'entries uncompressed): a decompression bomb or a damaged '
                'file'
            )
        if info.file_size > MAX_INFLATION * max(info.compress_size, 1):
            return (
                f'its entry {info.filename!r} declares '
                f'{human(info.file_size)} uncompressed from '
                f'{human(info.compress_size)} stored, more than '
                f'{MAX_INFLATION} times (torch.save stores its entries '
                'uncompressed): a decompression bomb or a damaged file'
            )
    if total > MAX_INFLATION * size:
        return (
            f'its {len(infos)} entries declare {human(total)} uncompressed '
            f'in all, more than {MAX_INFLATION} times the {human(size)} of '
            'the whole file (entries that share their stored bytes): a '
            'decompression bomb or a damaged file'
        )
    return None


def declared_bytes(file: Any) -> Optional[int]:
    """The bytes that loading ``file`` allocates for its records, as its
    zip central directory (or, in torch's legacy format, its storages)
    declare them; None when it is neither (read without loading).

    Args:
        file (str | file-like): A path, or a seekable binary buffer.

    Returns:
        int | None: The declared bytes in all.
    """
    if _size_of(file) is None:  # a FIFO or a device: never read here
        return None
    position = None if isinstance(file, (str, os.PathLike)) else file.tell()
    try:
        with zipfile.ZipFile(file) as archive:
            return sum(info.file_size for info in archive.infolist())
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return legacy_declared_bytes(file)
    finally:
        if position is not None:
            file.seek(position)


def _legacy_problem(file: Any, size: int) -> Optional[str]:
    """Why a legacy-format ``file`` of ``size`` bytes cannot hold the
    storages it declares; None when it can, or when it is no legacy file
    (:mod:`.legacy_declared_sizes`)."""
    declared = legacy_declared_bytes(file)
    if declared is None or declared <= size:
        return None
    return (
        f'its storages declare {human(declared)} in all, more than the '
        f"{human(size)} of the whole file (torch's legacy format stores "
        'them raw after the object): a damaged or crafted file'
    )


def check_declared_sizes(
    file: Any, what: str, name: Optional[str] = None
) -> None:
    """Raise unless ``file``'s declared sizes fit its size
    (:func:`size_problem`).

    Args:
        file (str | file-like): A path, or a seekable binary buffer.
        what (str): What the file is, for the message (``'checkpoint'``).
        name (str, optional): What the message calls the file. Defaults
            to ``file``.

    Raises:
        DeclaredSizeError: Naming the file, the entry and the sizes.
    """
    problem = size_problem(file)
    if problem is not None:
        raise DeclaredSizeError(
            f'nanguard: refusing to load the {what} {name or file!r}: '
            f'{problem}. Nothing was read from it; expected a file written '
            'by torch.save.'
        )


__all__ = [
    'DeclaredSizeError',
    'MAX_INFLATION',
    'check_declared_sizes',
    'declared_bytes',
    'human',
    'size_problem',
]
