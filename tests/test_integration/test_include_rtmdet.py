# Copyright (c) mmnanguard contributors. All rights reserved.
"""The include on rotated RTMDet, whose config already has ``custom_hooks``
(an ``EMAHook``), in an iteration-based loop with an injected fault."""

import pytest
from integration_utils import NANGUARD_RTMDET
from mmengine.hooks import EMAHook
from mmengine.registry import RUNNERS

from mmnanguard.engine.hooks import NanGuardHook
from mmnanguard.testing import (
    FaultInjectionHook,
    load_tiny_config,
    tensors_all_finite,
)


@pytest.mark.slow
def test_include_keeps_custom_hooks(tiny_dota_root, tmp_path):
    cfg = load_tiny_config(
        NANGUARD_RTMDET, str(tmp_path), tiny_dota_root, max_iters=2
    )
    upstream = [h['type'] for h in cfg.custom_hooks]
    assert upstream == ['mmdet.NumClassCheckHook', 'EMAHook']
    cfg.custom_hooks.append(
        dict(type='FaultInjectionHook', fault='inf_loss', iteration=0)
    )
    runner = RUNNERS.build(cfg)
    names = [type(h).__name__ for h in runner.hooks]
    assert names.count('NanGuardHook') == 1
    assert 'EMAHook' in names and 'NumClassCheckHook' in names
    # the guard acts before the EMA update (ABOVE_NORMAL < 49)
    assert names.index('NanGuardHook') < names.index('EMAHook')
    runner.train()

    assert runner.iter == 2
    guard = next(h for h in runner.hooks if isinstance(h, NanGuardHook))
    assert guard.counters['incidents'] == 1
    assert guard.counters['skipped'] == 1
    assert guard.last_report['iteration'] == 0
    fault = next(h for h in runner.hooks if isinstance(h, FaultInjectionHook))
    assert fault.fault == 'inf_loss'
    ema = next(h for h in runner.hooks if isinstance(h, EMAHook))
    assert tensors_all_finite(ema.ema_model.state_dict())
    assert tensors_all_finite(runner.model.state_dict())
