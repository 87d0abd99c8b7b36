# Copyright (c) mmnanguard contributors. All rights reserved.
import collections
import inspect
import os
import pickle
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from mmengine.logging import HistoryBuffer, MessageHub
from mmengine.runner.checkpoint import CheckpointLoader

from mmnanguard.compat import checkpoint_allowlist as mend
from mmnanguard.compat.checked_history_buffer import (
    CheckedHistoryBuffer,
    check_state,
)
from mmnanguard.compat.restricted_getattr import RestrictedGetattr
from mmnanguard.compat.safe_load import scoped_safe_globals

pytestmark = pytest.mark.stack_smoke


class _Payload:
    """A pickled object whose unpickling would run a command."""

    def __reduce__(self):
        return (os.system, ('echo pwned > /dev/null',))


class Stranger:
    """A harmless class that is simply not on the allowlist."""


def _mmengine_like_checkpoint():
    hub = MessageHub('allowlist_test')
    hub.update_scalar('train/loss', 1.5)
    hub.update_scalar('train/loss', 0.5)
    hub.update_info('seed', np.int64(7))
    return dict(
        meta=dict(iter=3, epoch=1, seed=7),
        state_dict=collections.OrderedDict(w=torch.ones(2)),
        message_hub=hub.state_dict(),
        optimizer=dict(state={}, param_groups=[dict(lr=0.1, params=[0])]),
    )


#: What a fresh interpreter that imports torch and the stack, but never
#: mmnanguard, has in torch's process-wide allowlist (torch registers its
#: own classes; torch 2.14 also builtins).
FRESH_ALLOWLIST = textwrap.dedent(
    """
    import collections, collections.abc, importlib.util, sys, torch
    import mmcv.ops, mmdet.models, mmengine.runner
    # what mmnanguard's collections mend does, for mmrotate 1.0.0rc1
    collections.Sequence = collections.abc.Sequence
    for name in ('mmrotate.models', 'mmseg.models'):
        if importlib.util.find_spec(name.split('.')[0]):
            __import__(name)
    assert 'mmnanguard' not in sys.modules
    for entry in torch.serialization.get_safe_globals():
        print(name_of(entry))
    """
)


def name_of(entry):
    """``module.qualname`` of an allowlist entry (or its given name)."""
    if isinstance(entry, tuple):
        return entry[1]
    module = getattr(entry, '__module__', None) or type(entry).__module__
    return f'{module}.{getattr(entry, "__qualname__", repr(entry))}'


def _added_to_torch_allowlist():
    """Entries of torch's process-wide allowlist that a fresh interpreter
    with the same stack, without mmnanguard, does not have."""
    proc = subprocess.run(
        [
            sys.executable,
            '-c',
            inspect.getsource(name_of) + FRESH_ALLOWLIST,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    fresh = set(proc.stdout.splitlines())
    here = [name_of(e) for e in torch.serialization.get_safe_globals()]
    # torch registers some of its own classes lazily (``_rebuild_njt``)
    return [n for n in here if n not in fresh and not n.startswith('torch.')]


@pytest.mark.slow
def test_applied_on_this_stack():
    assert mend.is_needed()
    import mmnanguard.compat as compat

    assert compat.APPLIED['checkpoint_allowlist'] is True
    # nothing was added to torch's process-wide allowlist
    assert _added_to_torch_allowlist() == []


@pytest.mark.slow
def test_mmengine_checkpoint_loads_with_weights_only(tmp_path):
    path = str(tmp_path / 'ok.pth')
    torch.save(_mmengine_like_checkpoint(), path)
    assert mend.unsafe_globals(path) == []
    ckpt = CheckpointLoader.load_checkpoint(path, map_location='cpu')
    buffer = ckpt['message_hub']['log_scalars']['train/loss']
    assert type(buffer) is HistoryBuffer  # mmengine's class, not a stand-in
    assert buffer.current() == pytest.approx(0.5)
    assert buffer.mean() == pytest.approx(1.0)  # (1.5 + 0.5) / 2
    seed = ckpt['message_hub']['runtime_info']['seed']
    assert type(seed) is np.int64 and seed == 7
    assert torch.equal(ckpt['state_dict']['w'], torch.ones(2))
    assert _added_to_torch_allowlist() == []
    # saved again, it references mmengine's class, never mmnanguard's
    again = str(tmp_path / 'again.pth')
    torch.save(ckpt, again)
    found = torch.serialization.get_unsafe_globals_in_checkpoint(again)
    assert 'mmengine.logging.history_buffer.HistoryBuffer' in found
    assert not [name for name in found if 'mmnanguard' in name]


@pytest.mark.parametrize(
    'dtype', ['float64', 'float32', 'float16', 'int64', 'uint8', 'bool']
)
def test_numpy_arrays_and_scalars_round_trip(tmp_path, dtype):
    values = np.array([[0, 1, 2], [3, 4, 5]]).astype(dtype)
    path = str(tmp_path / 'arrays.pth')
    torch.save(dict(array=values, scalar=values[1, 2]), path)
    loaded = mend.load_from_local(path)
    assert loaded['array'].dtype == np.dtype(dtype)
    np.testing.assert_array_equal(loaded['array'], values)
    assert loaded['scalar'] == values[1, 2]


def test_empty_history_buffer_loads(tmp_path):
    """An empty array's data pickles as ``bytes()``."""
    path = str(tmp_path / 'empty.pth')
    torch.save(dict(hub=HistoryBuffer()), path)
    loaded = mend.load_from_local(path)['hub']
    assert type(loaded) is HistoryBuffer
    assert loaded.data[0].shape == (0,) and loaded.data[1].shape == (0,)


@pytest.mark.parametrize(
    'values, kind',
    [
        (np.array([1, 'a'], dtype=object), 'O'),
        (np.array(['ab', 'c']), 'U'),
        (np.array([b'ab']), 'S'),
        (np.array(['2020-01-01'], dtype='datetime64[D]'), 'M'),
    ],
)
def test_non_numeric_arrays_are_refused(tmp_path, values, kind):
    path = str(tmp_path / 'objects.pth')
    torch.save(dict(array=values), path)
    with pytest.raises(mend.UntrustedCheckpointError) as err:
        mend.load_from_local(path)
    message = str(err.value)
    assert path in message and f'dtype of kind {kind!r}' in message


def test_checked_dtype_makes_only_bool_and_numeric_dtypes():
    for code in ('b1', 'i8', 'u1', 'f2', 'f8', 'c16'):
        dtype = mend.checked_dtype(code, False, True)
        assert dtype == np.dtype(code)
    for args, named in [
        (('O8', False, True), "kind 'O'"),
        (('V8', False, True), "kind 'V'"),
        (({'names': ['a'], 'formats': ['O']},), "expected numpy.dtype('"),
        (('f8', 0, 1), "expected numpy.dtype('"),
        (('no such type',), 'failed'),
    ]:
        with pytest.raises(pickle.UnpicklingError, match=re.escape(named)):
            mend.checked_dtype(*args)
    entries = dict((name, obj) for obj, name in _named(mend.numpy_globals()))
    assert entries['numpy.dtype'] is mend.checked_dtype
    assert np.dtype not in [obj for obj, _ in _named(mend.numpy_globals())]


def _named(entries):
    return [e if isinstance(e, tuple) else (e, name_of(e)) for e in entries]


@pytest.mark.parametrize(
    'payload, name',
    [
        (_Payload(), 'posix.system'),
        (Stranger(), 'Stranger'),
    ],
)
def test_foreign_object_is_refused(tmp_path, payload, name):
    path = str(tmp_path / 'evil.pth')
    ckpt = _mmengine_like_checkpoint()
    ckpt['meta']['extra'] = payload
    torch.save(ckpt, path)
    with pytest.raises(mend.UntrustedCheckpointError) as err:
        CheckpointLoader.load_checkpoint(path, map_location='cpu')
    message = str(err.value)
    assert path in message and name in message
    assert 'globals outside the allowlist' in message
    # weights_only is still the default: plain torch.load refuses as well
    with pytest.raises(Exception, match='Weights only load failed'):
        torch.load(path)


@pytest.mark.slow
def test_remote_scheme_loads_in_scope(tmp_path, monkeypatch):
    """``https://`` goes through mmengine's ``load_from_http``, whose
    download ends in ``torch.load(cached_file)`` (faked here: no network)."""
    import mmengine.runner.checkpoint as mmengine_checkpoint

    good, evil = str(tmp_path / 'good.pth'), str(tmp_path / 'evil.pth')
    torch.save(_mmengine_like_checkpoint(), good)
    torch.save(dict(meta=Stranger()), evil)
    cache = {'https://zoo/good.pth': good, 'https://zoo/evil.pth': evil}

    def load_url(url, model_dir=None, map_location=None, progress=False):
        return torch.load(cache[url], map_location=map_location)

    monkeypatch.setattr(mmengine_checkpoint, 'load_url', load_url)
    ckpt = CheckpointLoader.load_checkpoint('https://zoo/good.pth')
    buffer = ckpt['message_hub']['log_scalars']['train/loss']
    assert type(buffer) is HistoryBuffer and buffer.current() == 0.5
    with pytest.raises(mend.UntrustedCheckpointError) as err:
        CheckpointLoader.load_checkpoint('https://zoo/evil.pth')
    assert 'https://zoo/evil.pth' in str(err.value)
    assert 'Stranger' in str(err.value)
    assert _added_to_torch_allowlist() == []


def test_missing_file_is_named(tmp_path):
    path = str(tmp_path / 'none.pth')
    with pytest.raises(FileNotFoundError, match='none.pth'):
        mend.load_from_local(path)


def test_restricted_getattr_resolves_only_its_pairs():
    lookup = RestrictedGetattr([(HistoryBuffer, 'mean')])
    assert lookup(HistoryBuffer, 'mean') is HistoryBuffer.mean
    with pytest.raises(pickle.UnpicklingError, match='_statistics_methods'):
        lookup(HistoryBuffer, '_statistics_methods')
    with pytest.raises(pickle.UnpicklingError, match='__globals__'):
        lookup(HistoryBuffer.mean, '__globals__')
    with pytest.raises(pickle.UnpicklingError, match=r'\.\.\.'):
        lookup(HistoryBuffer, 'mean', None)  # no default either


def _state(**changes):
    state = dict(
        max_length=5,
        _log_history=np.array([1.0]),
        _count_history=np.array([1]),
        statistics_methods=dict(mean=HistoryBuffer.mean),
    )
    state.update(changes)
    return state


@pytest.mark.parametrize(
    'changes, named',
    [
        (dict(_statistics_methods={}), "['_statistics_methods']"),
        (dict(statistics_methods=dict(mean=HistoryBuffer.max)), "'mean'"),
        (dict(statistics_methods=dict(median=HistoryBuffer.mean)), 'median'),
        (dict(statistics_methods=[]), 'statistics_methods'),
        (dict(_log_history=[1.0]), '_log_history'),
        (dict(max_length='5'), 'max_length'),
        (dict(max_length=True), 'max_length'),
    ],
)
def test_history_buffer_state_is_checked(changes, named):
    with pytest.raises(pickle.UnpicklingError) as err:
        check_state(_state(**changes))
    assert named in str(err.value)


def test_checked_history_buffer_becomes_a_plain_one():
    buffer = CheckedHistoryBuffer.__new__(CheckedHistoryBuffer)
    buffer.__setstate__(_state())
    assert type(buffer) is HistoryBuffer
    assert buffer.max_length == 5 and buffer.current() == 1.0


def test_checked_history_buffer_cannot_be_called():
    with pytest.raises(pickle.UnpicklingError, match='NEWOBJ and BUILD'):
        CheckedHistoryBuffer([1.0], [1])


def test_scope_keeps_entries_that_were_there_before():
    before = torch.serialization.get_safe_globals()
    torch.serialization.add_safe_globals([Stranger])
    try:
        with scoped_safe_globals([Stranger, HistoryBuffer]):
            assert HistoryBuffer in torch.serialization.get_safe_globals()
        after = set(torch.serialization.get_safe_globals())
        assert after == set(before) | {Stranger}
    finally:
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals(before)


def test_not_needed_before_torch_2_6(monkeypatch):
    monkeypatch.setattr(mend.torch, '__version__', '2.5.1')
    assert not mend.is_needed()
    assert mend.apply() is False
