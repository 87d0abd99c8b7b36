# Copyright (c) mmnanguard contributors. All rights reserved.
"""safe_modules.py keeps mmrotate's GDLoss_v1 and says why it has no
drop-in (needs mmrotate)."""

import mmrotate  # noqa: F401
from mmengine.config import Config

from mmnanguard.engine.runner.protection import ProtectionSettings
from mmnanguard.engine.runner.rewrite import rewrite_model_config
from mmnanguard.testing.tiny_configs import MIM_ROOT

SAFE_MODULES = MIM_ROOT + '/configs/_base_/safe_modules.py'


def _swaps():
    swaps = Config.fromfile(SAFE_MODULES).nanguard.module_swaps
    return ProtectionSettings(module_swaps=[dict(s) for s in swaps])


def test_gdloss_v1_is_kept_with_the_reason_and_the_real_fix():
    model = dict(
        type='RotatedRetinaNet',
        bbox_head=dict(
            type='RotatedRetinaHead',
            loss_cls=dict(type='FocalLoss', use_sigmoid=True),
            loss_bbox=dict(type='GDLoss_v1', loss_type='kld'),
        ),
    )
    notes = rewrite_model_config(model, _swaps(), scope='mmrotate')
    texts = [t for _, t in notes]
    assert any('FocalLoss -> StableFocalLoss' in t for t in texts)
    (kept,) = [t for t in texts if 'kept' in t]
    assert 'kept model.bbox_head.loss_bbox (GDLoss_v1 (mmrotate))' in kept
    # the swapped-in drop-in is the one loss kept without a reason
    assert (
        'with no drop-in for them: model.bbox_head.loss_cls '
        '(StableFocalLoss (mmnanguard)).' in kept
    )
    assert 'GDLoss_v1 has no drop-in' in kept
    assert 'reg_decoded_bbox=True' in kept
