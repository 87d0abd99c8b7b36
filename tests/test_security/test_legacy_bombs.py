# Copyright (c) mmnanguard contributors. All rights reserved.
"""torch's legacy (non-zip) format: storages that declare more bytes than
the file holds.

torch's legacy loader allocates each storage at the ``numel`` its
persistent id declares, before reading its bytes; against the code as it
was, a 368-byte file declaring 8 GiB reached that loader, which failed
with torch's own ``RuntimeError: storage has wrong byte size: expected
%ld got %ld`` (no file named, a traceback under ``load_from``). The
declared sizes are now read from the pickles alone, with every global an
inert stand-in (:mod:`mmnanguard.compat.legacy_declared_sizes`), and such
a file is refused by name before any load. Real legacy files, shared and
viewed storages included, pass with their exact byte count.
"""

import io
import os

import crafted_files as crafted
import pytest
import torch
from toy_runs import protected_toy_runner

from mmnanguard.compat.checkpoint_allowlist import load_from_local
from mmnanguard.compat.declared_sizes import DeclaredSizeError, size_problem
from mmnanguard.compat.legacy_declared_sizes import legacy_declared_bytes
from mmnanguard.engine.incident import NotAnIncidentError, load_batch
from mmnanguard.engine.runner import UnusableCheckpointError

GiB = 1 << 30


def _legacy(obj) -> io.BytesIO:
    buf = io.BytesIO()
    torch.save(obj, buf, _use_new_zipfile_serialization=False)
    buf.seek(0)
    return buf


def _distinct_storage_bytes(obj) -> int:
    """The independent count: the bytes of each distinct storage."""
    seen = {}
    for value in obj.values():
        storage = value.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


REAL = {
    'one': lambda: {'w': torch.randn(4)},
    'dtypes': lambda: {
        'f64': torch.zeros(3, dtype=torch.float64),
        'f16': torch.zeros(5, dtype=torch.float16),
        'bool': torch.zeros(7, dtype=torch.bool),
        'i64': torch.arange(6),
        'c128': torch.zeros(2, dtype=torch.complex128),
    },
    'shared_and_views': lambda: (
        lambda base: {'base': base, 'view': base[2:5], 'row': base[:1]}
    )(torch.randn(10)),
    'empty_tensor': lambda: {'e': torch.zeros(0)},
    'no_tensors': lambda: {'lr': 0.1, 'names': ['a', 'b']},
}


@pytest.mark.parametrize('case', sorted(REAL))
def test_real_legacy_files_declare_their_exact_bytes(case):
    obj = REAL[case]()
    buf = _legacy(obj)
    tensors = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    assert legacy_declared_bytes(buf) == _distinct_storage_bytes(tensors)
    assert buf.tell() == 0  # the position is restored
    assert size_problem(buf) is None
    loaded = torch.load(buf, weights_only=True)
    assert loaded.keys() == obj.keys()


@pytest.mark.parametrize('numel', [2**20, 2**31 - 1, 2**40])
def test_storage_declaring_more_than_the_file_is_refused(tmp_path, numel):
    path = str(tmp_path / 'weights.pth')
    crafted.write_legacy_storage_bomb(path, {'w': torch.zeros(4)}, numel)
    size = os.path.getsize(path)
    assert legacy_declared_bytes(path) == 4 * numel  # FloatStorage
    problem = size_problem(path)
    assert problem is not None and f'{size} bytes' in problem
    assert 'legacy format' in problem
    with pytest.raises(DeclaredSizeError) as info:
        load_from_local(path)
    assert path in str(info.value)


def test_load_from_a_legacy_bomb_is_refused_by_name(tmp_path):
    path = str(tmp_path / 'pretrained.pth')
    crafted.write_legacy_storage_bomb(path, {'w': torch.zeros(4)}, 2**31 - 1)
    runner = protected_toy_runner(tmp_path / 'work', 1, load_from=path)
    with pytest.raises(UnusableCheckpointError) as info:
        runner.train()
    message = str(info.value)
    assert f"load_from='{path}'" in message
    assert '8.0 GiB' in message and 'legacy format' in message


def test_a_legacy_incident_batch_declaring_gigabytes_is_refused(tmp_path):
    folder = tmp_path / 'incident_000_iter000001'
    folder.mkdir()
    batch = str(folder / 'batch.pth')
    crafted.write_legacy_storage_bomb(
        batch, {'inputs': [torch.zeros(3)]}, 4 * GiB
    )
    with pytest.raises(NotAnIncidentError) as info:
        load_batch(batch)
    assert batch in str(info.value) and '16.0 GiB' in str(info.value)


ATTACKS = (
    'foreign_call',
    'getattr_to_module_globals',
    'dotted_global_proto4',
    'collect_env_run',
    'numpy_runstring',
    'builtins_setattr',
)


@pytest.mark.parametrize('attack', ATTACKS)
def test_reading_the_sizes_runs_nothing_from_the_file(tmp_path, attack):
    marker = tmp_path / 'ran'
    payload = getattr(crafted, attack)(str(marker))
    path = crafted.WRITERS['legacy'](str(tmp_path / 'attack.pth'), payload)
    legacy_declared_bytes(path)
    size_problem(path)
    assert not marker.exists()
