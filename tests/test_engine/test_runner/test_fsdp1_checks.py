# Copyright (c) mmnanguard contributors. All rights reserved.
"""A protected ``FSDPStrategy`` run that writes local (sharded)
checkpoints is refused when it is built if it would load one (a rollback
from a checkpoint, a resume, ``load_from``), with the fix; the full layout
and rollbacks from memory are accepted."""

import pytest

from mmnanguard.compat import fsdp1_cpu
from mmnanguard.engine.runner import NanGuardFlexibleRunner
from mmnanguard.testing.toy import toy_runner_cfg

pytestmark = pytest.mark.skipif(
    fsdp1_cpu.FSDPStrategy is None, reason='no FSDPStrategy on this stack'
)


def _build(tmp_path, state_dict_cfg, nanguard, **kwargs):
    cfg = toy_runner_cfg(str(tmp_path), **kwargs)
    return NanGuardFlexibleRunner(
        strategy=dict(type='FSDPStrategy', state_dict_cfg=state_dict_cfg),
        nanguard=nanguard,
        **cfg,
    )


@pytest.mark.parametrize(
    'nanguard, kwargs, named',
    [
        (
            dict(rollback_source='checkpoint'),
            {},
            "nanguard.rollback_source='checkpoint'",
        ),
        (dict(), dict(resume=True), 'resume=True'),
        (dict(), dict(load_from='ckpt/iter_2.pth'), "load_from='ckpt/"),
    ],
)
def test_local_checkpoints_that_would_be_loaded_are_refused(
    tmp_path, nanguard, kwargs, named
):
    with pytest.raises(ValueError) as info:
        _build(tmp_path, 'local', nanguard, **kwargs)
    message = str(info.value)
    assert message.startswith('nanguard: ' + named), message
    assert "state_dict_cfg='full'" in message
    assert 'ShardedTensor' in message


@pytest.mark.parametrize(
    'state_dict_cfg, nanguard',
    [
        ('full', dict(rollback_source='checkpoint')),
        ('local', dict(rollback_source='memory')),
        ('local', dict(policy='off', rollback_source='checkpoint')),
    ],
)
def test_loadable_or_unloaded_layouts_are_accepted(
    tmp_path, state_dict_cfg, nanguard
):
    runner = _build(tmp_path, state_dict_cfg, nanguard)
    assert runner.strategy.__class__.__name__ == 'FSDPStrategy'
