# Copyright (c) mmnanguard contributors. All rights reserved.
"""Honest files of every supported config family still load.

One short real run per family (2 iterations of the tiny config with the
``mmnanguard`` include, an ``inf`` loss planted at iteration 1; the
session's runs of ``tests/family_runs.py``) writes a real mmengine
checkpoint and a real incident folder. Each is then read
back through the restricted loaders and compared with what the full
unpickler (``weights_only=False``) reads from the same file; the
checkpoint resumes a real ``Runner``, and the incident replays through
``tools/replay.py``.
"""

import os.path as osp
import sys

import numpy as np
import pytest
import torch
from mmengine.hooks import EMAHook, Hook
from mmengine.logging.history_buffer import HistoryBuffer
from mmengine.registry import RUNNERS
from mmengine.runner.checkpoint import CheckpointLoader

from mmnanguard.compat import checkpoint_allowlist
from mmnanguard.engine.diagnosis import load_incident
from mmnanguard.engine.incident import (
    check_batch_globals,
    incident_batch_globals,
)
from mmnanguard.testing.tiny_configs import MIM_ROOT

sys.path.insert(0, osp.join(MIM_ROOT, 'tools'))
import replay  # noqa: E402
from family_runs import family_cfg  # noqa: E402
from real_runs import CHECKPOINT_GLOBALS, FAMILIES, RESUMED  # noqa: E402

# each family's first test trains it (the session's run)
pytestmark = pytest.mark.slow


@pytest.fixture(scope='module', params=sorted(FAMILIES))
def real_run(request, real_runs):
    """The 2-iteration run of one family: its checkpoint and incident."""
    return real_runs(request.param)


@pytest.fixture(scope='module', params=sorted(RESUMED))
def resumed_run(request, real_runs):
    """The run of a family whose checkpoint is resumed."""
    return real_runs(request.param)


def test_checkpoint_holds_exactly_the_known_globals(real_run):
    path = real_run['checkpoint']
    found = set(torch.serialization.get_unsafe_globals_in_checkpoint(path))
    assert found == CHECKPOINT_GLOBALS
    assert checkpoint_allowlist.unsafe_globals(path) == []
    # torch alone refuses it; the scope did not leak into torch.load
    with pytest.raises(Exception, match='HistoryBuffer'):
        torch.load(path)


def test_checkpoint_loads_as_the_full_unpickler_reads_it(real_run):
    path = real_run['checkpoint']
    restricted = CheckpointLoader.load_checkpoint(path, map_location='cpu')
    full = torch.load(path, map_location='cpu', weights_only=False)
    assert restricted.keys() == full.keys()
    for name, tensor in full['state_dict'].items():
        assert torch.equal(restricted['state_dict'][name], tensor), name
    scalars = restricted['message_hub']['log_scalars']
    assert scalars.keys() == full['message_hub']['log_scalars'].keys()
    for key, buffer in scalars.items():
        assert type(buffer) is HistoryBuffer
        want = full['message_hub']['log_scalars'][key]
        np.testing.assert_array_equal(buffer.data[0], want.data[0])
        np.testing.assert_array_equal(buffer.data[1], want.data[1])
    assert restricted['meta']['iter'] == full['meta']['iter'] == 2
    assert restricted['nanguard'] == full['nanguard']


def test_checkpoint_resumes_a_real_runner(resumed_run):
    real_run = resumed_run
    full = torch.load(
        real_run['checkpoint'], map_location='cpu', weights_only=False
    )
    cfg = family_cfg(
        real_run['config'],
        real_run['work_dir'],
        real_run['data_root'],
        3,
        resume=True,
        load_from=real_run['checkpoint'],
    )
    runner = RUNNERS.build(cfg)
    seen = {}

    class Probe(Hook):
        def before_train(self, runner):
            seen['iter'] = runner.iter
            losses = runner.message_hub.get_scalar('train/loss').data[0]
            seen['losses'] = losses.tolist()
            seen['weights'], seen['ema'] = _restored(runner, full)

    runner.register_hook(Probe(), priority='LOWEST')
    runner.train()
    saved = full['message_hub']['log_scalars']['train/loss'].data[0]
    assert seen == dict(iter=2, losses=saved.tolist(), weights=True, ema=True)
    assert runner.iter == 3


def _restored(runner, full):
    """Whether the model (and the EMA model) hold the saved weights.

    ``EMAHook`` saves the averaged weights as ``state_dict`` and the
    trained ones as ``ema_state_dict`` (``module.``-prefixed), and swaps
    them back on resume.
    """
    model = runner.model.state_dict()
    ema = [h for h in runner.hooks if isinstance(h, EMAHook)]
    if not ema:
        weights = all(
            torch.equal(model[k], v) for k, v in full['state_dict'].items()
        )
        return weights, 'ema_state_dict' not in full
    averaged = ema[0].ema_model.state_dict()
    keys = [k[7:] for k in full['ema_state_dict'] if k[:7] == 'module.']
    trained = full['ema_state_dict']
    weights = all(torch.equal(model[k], trained[f'module.{k}']) for k in keys)
    return weights, len(keys) > 0 and all(
        torch.equal(averaged[f'module.{k}'], full['state_dict'][k])
        for k in keys
    )


def test_incident_loads_as_the_full_unpickler_reads_it(real_run):
    batch_path = osp.join(real_run['incident'], 'batch.pth')
    found = torch.serialization.get_unsafe_globals_in_checkpoint(batch_path)
    classes = {name.rsplit('.', 1)[1] for name in found}
    assert FAMILIES[real_run['family']] <= classes
    allowed = {
        c[1] if isinstance(c, tuple) else f'{c.__module__}.{c.__qualname__}'
        for c in incident_batch_globals()
    }
    assert set(found) <= allowed
    assert check_batch_globals(batch_path) == []
    report, batch = load_incident(real_run['incident'])
    full = torch.load(batch_path, map_location='cpu', weights_only=False)
    assert report['iteration'] == batch['iteration'] == full['iteration'] == 1
    inputs = batch['data_batch']['inputs']
    for got, want in zip(inputs, full['data_batch']['inputs']):
        assert torch.equal(got, want)
    for got, want in zip(
        batch['data_batch']['data_samples'],
        full['data_batch']['data_samples'],
    ):
        assert type(got) is type(want)
        assert got.metainfo.keys() == want.metainfo.keys()
        assert got.keys() == want.keys()
    assert torch.equal(batch['rng_state']['torch'], full['rng_state']['torch'])


def test_incident_replays_with_the_named_config(real_run, capsys):
    code = replay.main([real_run['incident'], '--config', real_run['config']])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert 'nonfinite_loss' in out.out and 'iteration 1' in out.out
