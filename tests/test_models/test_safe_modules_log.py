# Copyright (c) mmnanguard contributors. All rights reserved.
"""safe_modules.py says which losses of the model it keeps (no drop-in
for them), and why GDLoss_v1 and mmocr's CTCModuleLoss have none."""

import logging
import os.path as osp

from mmengine.config import Config

from mmnanguard.engine.runner.protection import ProtectionSettings
from mmnanguard.engine.runner.rewrite import rewrite_model_config
from mmnanguard.models.drop_in_resolution import describe_kept
from mmnanguard.testing.tiny_configs import MIM_ROOT, TINY_COCO_CONFIG

SAFE_MODULES = osp.join(MIM_ROOT, 'configs', '_base_', 'safe_modules.py')


def _swaps():
    swaps = Config.fromfile(SAFE_MODULES).nanguard.module_swaps
    return ProtectionSettings(module_swaps=[dict(s) for s in swaps])


def test_a_model_with_nothing_to_swap_lists_its_losses():
    model = dict(
        type='RetinaNet',
        bbox_head=dict(
            type='GFLHead',
            loss_cls=dict(type='QualityFocalLoss', use_sigmoid=True),
            loss_dfl=dict(type='DistributionFocalLoss'),
            loss_bbox=dict(type='GIoULoss'),
        ),
    )
    notes = rewrite_model_config(model, _swaps(), scope='mmdet')
    assert [level for level, _ in notes] == [logging.INFO]
    text = notes[0][1]
    assert 'kept 3 loss(es) as configured' in text
    for path, cls in (
        ('model.bbox_head.loss_cls', 'QualityFocalLoss'),
        ('model.bbox_head.loss_dfl', 'DistributionFocalLoss'),
        ('model.bbox_head.loss_bbox', 'GIoULoss'),
    ):
        assert f'{path} ({cls} (mmdet))' in text


def test_the_tiny_coco_model_logs_swaps_and_kept_losses():
    cfg = Config.fromfile(TINY_COCO_CONFIG)
    notes = rewrite_model_config(cfg.model, _swaps(), scope='mmdet')
    texts = ' '.join(t for _, t in notes)
    assert 'StableFocalLoss' in texts
    assert 'model.bbox_head.loss_bbox (L1Loss (mmdet))' in texts


def test_a_ctc_loss_is_kept_with_ctcs_own_reason():
    text = describe_kept(
        [
            ('model.decoder.module_loss', 'CTCModuleLoss (mmocr)'),
            ('model.aux_loss', 'MyLoss (mypkg)'),
        ]
    )
    assert (
        'kept 1 loss(es) as configured, with no drop-in for them: '
        'model.aux_loss (MyLoss (mypkg)).' in text
    )
    assert 'kept model.decoder.module_loss (CTCModuleLoss (mmocr)): ' in text
    assert 'zero_infinity=True' in text and 'ctc_alignment' in text
    # nothing is said of a loss that mmnanguard does not know
    assert 'no known NaN failure' not in text
