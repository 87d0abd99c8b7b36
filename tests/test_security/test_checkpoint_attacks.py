# Copyright (c) mmnanguard contributors. All rights reserved.
"""Crafted checkpoints are refused by every loader, zip and legacy format.

Each attack, against the mend as it was (``builtins.getattr`` and the rest
added to torch's allowlist for the whole process), created its marker
file or changed ``HistoryBuffer`` for the whole process, through all four
loaders. Now each is refused before anything runs: no marker, the class
unchanged, and the error names the file and what was refused.
"""

import io
import os.path as osp
import pickle

import crafted_files as crafted
import pytest
import torch
from mmengine.logging.history_buffer import HistoryBuffer
from mmengine.runner import Runner, load_checkpoint
from mmengine.runner import checkpoint as mmengine_checkpoint
from mmengine.runner.checkpoint import CheckpointLoader

from mmnanguard.compat.checkpoint_allowlist import UntrustedCheckpointError
from mmnanguard.compat.strict_torch_load import strict_torch_load
from mmnanguard.testing.toy import ToyModel, toy_runner_cfg

pytestmark = pytest.mark.stack_smoke

#: attack -> (payload(marker), what the error must name)
ATTACKS = {
    'getattr_to_module_globals': (
        crafted.getattr_to_module_globals,
        "getattr(<builtins.function object>, '__globals__')",
    ),
    'history_buffer_statistics': (
        crafted.history_buffer_statistics,
        "statistics method 'mean'",
    ),
    'history_buffer_extra_attribute': (
        crafted.history_buffer_extra_attribute,
        "unexpected keys ['_statistics_methods']",
    ),
    'foreign_call': (crafted.foreign_call, 'posix.system'),
    'object_array': (crafted.object_array, "kind 'O'"),
    'history_buffer_never_built': (
        crafted.history_buffer_never_built,
        'never restores (no BUILD)',
    ),
    'dotted_global_proto4': (crafted.dotted_global_proto4, 'os.system'),
}


def _load_torch(path, tmp_path):
    return torch.load(path)


def _load_checkpoint_loader(path, tmp_path):
    return CheckpointLoader.load_checkpoint(path, map_location='cpu')


def _load_checkpoint(path, tmp_path):
    return load_checkpoint(ToyModel(), path, map_location='cpu')


def _resume(path, tmp_path):
    cfg = toy_runner_cfg(
        str(tmp_path / 'resume'), max_iters=1, load_from=path, resume=True
    )
    Runner(**cfg).train()


def _mmengine_torch_load():
    """mmengine's own ``torch.load`` wrapper where it has one
    (onedl-mmengine's ``_safe_torch_load``, behind every remote scheme:
    mended), else the mend itself."""
    return getattr(mmengine_checkpoint, '_safe_torch_load', strict_torch_load)


def _load_mmengine_internal(path, tmp_path):
    return _mmengine_torch_load()(path, map_location='cpu')


def _load_downloaded_buffer(path, tmp_path):
    with open(path, 'rb') as f:  # what s3:// and petrel:// hand over
        return _mmengine_torch_load()(io.BytesIO(f.read()), map_location='cpu')


LOADERS = {
    'torch.load': _load_torch,
    'CheckpointLoader': _load_checkpoint_loader,
    'load_checkpoint': _load_checkpoint,
    'Runner.resume': _resume,
    'mmengine torch.load wrapper': _load_mmengine_internal,
    'downloaded buffer': _load_downloaded_buffer,
}


@pytest.fixture
def statistics_kept():
    """``HistoryBuffer``'s class-wide statistics stay the built-in ones."""
    HistoryBuffer()  # registers the defaults, as any buffer does
    before = dict(HistoryBuffer._statistics_methods)
    yield
    assert HistoryBuffer._statistics_methods == before
    assert HistoryBuffer._statistics_methods['mean'] is HistoryBuffer.mean


@pytest.mark.parametrize('fmt', sorted(crafted.WRITERS))
@pytest.mark.parametrize('loader', sorted(LOADERS))
@pytest.mark.parametrize('attack', sorted(ATTACKS))
def test_crafted_checkpoint_is_refused(
    tmp_path, statistics_kept, attack, loader, fmt
):
    marker = str(tmp_path / 'marker')
    payload, named = ATTACKS[attack]
    path = crafted.WRITERS[fmt](str(tmp_path / 'ckpt.pth'), payload(marker))
    with pytest.raises(pickle.UnpicklingError) as err:
        LOADERS[loader](path, tmp_path)
    assert not osp.exists(marker)
    message = str(err.value)
    if loader == 'torch.load':  # torch's own refusal, unchanged
        assert 'Weights only load failed' in message
        return
    assert isinstance(err.value, UntrustedCheckpointError)
    if loader == 'downloaded buffer':
        path = 'a downloaded checkpoint'
    assert path in message and named in message, message


def test_refused_call_is_named_not_an_empty_list(tmp_path):
    marker = str(tmp_path / 'marker')
    path = crafted.write_zip(
        str(tmp_path / 'ckpt.pth'), crafted.getattr_to_module_globals(marker)
    )
    with pytest.raises(UntrustedCheckpointError) as err:
        CheckpointLoader.load_checkpoint(path)
    message = str(err.value)
    assert 'the unpickler refused a call or operation' in message
    assert '[]' not in message and "'__globals__'" in message


def test_plain_torch_load_refuses_what_torch_alone_refuses(tmp_path):
    """The same files, in this process (mmnanguard imported) and in a
    fresh interpreter that never imports it, get the same verdicts."""
    import subprocess
    import sys

    files = []
    for name in sorted(ATTACKS):
        for fmt, write in sorted(crafted.WRITERS.items()):
            marker = str(tmp_path / f'{name}_{fmt}.marker')
            payload = ATTACKS[name][0](marker)
            files.append(write(str(tmp_path / f'{name}_{fmt}.pth'), payload))
    honest = str(tmp_path / 'honest.pth')
    torch.save(dict(w=torch.ones(2), meta=dict(iter=1)), honest)
    buffer = str(tmp_path / 'buffer.pth')
    torch.save(dict(hub=HistoryBuffer([1.0], [1])), buffer)
    files += [honest, buffer]

    script = (
        'import sys, torch\n'
        'for path in sys.argv[1:]:\n'
        '    try:\n'
        '        torch.load(path)\n'
        "        print('loaded')\n"
        '    except Exception:\n'
        "        print('refused')\n"
        "assert 'mmnanguard' not in sys.modules\n"
    )
    alone = subprocess.run(
        [sys.executable, '-c', script] + files,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    here = []
    for path in files:
        try:
            torch.load(path)
            here.append('loaded')
        except Exception:  # noqa: BLE001  (the verdict is what is compared)
            here.append('refused')
    assert here == alone
    assert alone == ['refused'] * (len(files) - 2) + ['loaded', 'refused']
    assert not any(osp.exists(p) for p in tmp_path.glob('*.marker'))
