# Copyright (c) mmnanguard contributors. All rights reserved.
"""The storage sizes a ``torch.save`` file in torch's legacy (non-zip)
format declares, read without loading it.

A legacy file is a row of pickles: a magic number, the protocol version,
system information, the object (whose tensors name their storages by
persistent ids ``('storage', StorageType, key, location, numel, view)``),
the list of storage keys, then each storage's bytes, raw. torch's legacy
loader allocates every storage at its declared ``numel`` before it reads
a byte of it. :func:`legacy_declared_bytes` reads the object's pickle with
an unpickler whose every global is an inert stand-in (nothing named in the
file is imported, called or built) and sums the declared bytes of the
distinct storages. Since the bytes follow raw, a file that declares more
than it holds is damaged or crafted; :mod:`.declared_sizes` refuses it.
Only the pickles are read, never the storages.
"""

import os
import pickle
from typing import Any, Dict, Optional

import torch

#: ``torch.serialization.MAGIC_NUMBER``: the first pickle of a legacy file.
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C

#: Bytes per element of the storage types torch writes, by name; a name
#: not here counts 1 byte (every element takes at least one, so the
#: bound stays true).
ELEMENT_SIZES: Dict[str, int] = {
    f'{name}Storage': dtype.itemsize
    for name, dtype in (
        ('Double', torch.float64),
        ('Float', torch.float32),
        ('Half', torch.float16),
        ('BFloat16', torch.bfloat16),
        ('Long', torch.int64),
        ('Int', torch.int32),
        ('Short', torch.int16),
        ('Char', torch.int8),
        ('Byte', torch.uint8),
        ('Bool', torch.bool),
        ('ComplexFloat', torch.complex64),
        ('ComplexDouble', torch.complex128),
    )
}


class _Inert:
    """What every global of the file stands for: it takes any arguments
    and any state, and does nothing."""

    storage_name = ''

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def append(self, value: Any) -> None:
        pass

    def extend(self, values: Any) -> None:
        pass


class _SkeletonUnpickler(pickle.Unpickler):
    """Reads a pickle's structure; records the storages it declares."""

    def __init__(self, file: Any) -> None:
        super().__init__(file)
        self.storages: Dict[Any, int] = {}

    def find_class(self, module: str, name: str) -> type:
        return type(name, (_Inert,), {'storage_name': name})

    def persistent_load(self, pid: Any) -> Any:
        if (
            isinstance(pid, tuple)
            and len(pid) >= 5
            and pid[0] in ('storage', b'storage')
        ):
            storage_type, key, numel = pid[1], pid[2], pid[4]
            name = getattr(storage_type, 'storage_name', '')
            if not isinstance(numel, int) or numel < 0:
                raise pickle.UnpicklingError(f'storage numel {numel!r}')
            nbytes = numel * ELEMENT_SIZES.get(name, 1)
            self.storages[key] = max(self.storages.get(key, 0), nbytes)
        return _Inert()


def _plain(file: Any) -> Any:
    """One pickle of plain values (no global allowed)."""

    class _NoGlobals(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> type:
            raise pickle.UnpicklingError(f'global {module}.{name}')

    return _NoGlobals(file).load()


def legacy_declared_bytes(file: Any) -> Optional[int]:
    """The bytes the storages of a legacy-format file declare, in all.

    Args:
        file (str | file-like): A path, or a seekable binary buffer (its
            position is restored).

    Returns:
        int | None: The sum over distinct storages; None when ``file`` is
        not a readable legacy-format file (the loader names why).
    """
    opened = isinstance(file, (str, os.PathLike))
    handle = open(file, 'rb') if opened else file
    # where to put a buffer passed in back (a file opened here is closed)
    position: int = 0 if opened else handle.tell()
    try:
        if not opened:
            handle.seek(0)
        if _plain(handle) != LEGACY_MAGIC:
            return None
        _plain(handle)  # the protocol version
        _plain(handle)  # system information
        reader = _SkeletonUnpickler(handle)
        reader.load()
        return sum(reader.storages.values())
    except (
        pickle.UnpicklingError,
        EOFError,
        ValueError,
        TypeError,
        AttributeError,
        IndexError,
        KeyError,
        OverflowError,
        MemoryError,
        RecursionError,
    ):
        return None
    finally:
        if opened:
            handle.close()
        else:
            handle.seek(position)
