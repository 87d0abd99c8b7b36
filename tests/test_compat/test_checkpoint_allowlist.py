# Copyright (c) mmnanguard contributors. All rights reserved.
import collections
import os

import numpy as np
import pytest
import torch
from mmengine.logging import HistoryBuffer, MessageHub
from mmengine.runner.checkpoint import CheckpointLoader

from mmnanguard.compat import checkpoint_allowlist as mend


class _Payload:
    """A pickled object whose unpickling would run a command."""

    def __reduce__(self):
        return (os.system, ('echo pwned > /dev/null',))


class Stranger:
    """A harmless class that is simply not on the allowlist."""


def _mmengine_like_checkpoint():
    hub = MessageHub('allowlist_test')
    hub.update_scalar('train/loss', 1.5)
    hub.update_info('seed', np.int64(7))
    return dict(
        meta=dict(iter=3, epoch=1, seed=7),
        state_dict=collections.OrderedDict(w=torch.ones(2)),
        message_hub=hub.state_dict(),
        optimizer=dict(state={}, param_groups=[dict(lr=0.1, params=[0])]),
    )


def test_applied_on_this_stack():
    assert mend.is_needed()
    import mmnanguard.compat as compat

    assert compat.APPLIED['checkpoint_allowlist'] is True


def test_mmengine_checkpoint_loads_with_weights_only(tmp_path):
    path = str(tmp_path / 'ok.pth')
    torch.save(_mmengine_like_checkpoint(), path)
    assert mend.unsafe_globals(path) == []
    ckpt = CheckpointLoader.load_checkpoint(path, map_location='cpu')
    buffer = ckpt['message_hub']['log_scalars']['train/loss']
    assert isinstance(buffer, HistoryBuffer)
    assert buffer.current() == pytest.approx(1.5)
    assert torch.equal(ckpt['state_dict']['w'], torch.ones(2))


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
    # weights_only is still the default: plain torch.load refuses as well
    with pytest.raises(Exception, match='Weights only load failed'):
        torch.load(path)


def test_not_needed_before_torch_2_6(monkeypatch):
    monkeypatch.setattr(mend.torch, '__version__', '2.5.1')
    assert not mend.is_needed()
    assert mend.apply() is False
