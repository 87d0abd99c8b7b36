# Copyright (c) mmnanguard contributors. All rights reserved.
"""mmrotate's losses told by their behaviour, and GDLoss_v1 fed encoded
deltas found on the built model (needs mmrotate)."""

import mmrotate  # noqa: F401
import pytest
from mmengine.config import Config
from mmengine.registry import MODELS, init_default_scope

from mmnanguard.config_walk import build_in_scope
from mmnanguard.models.loss_kind import (
    EncodedDeltasRecord,
    describe_mismatch,
    encoded_deltas_into_box_loss,
    loss_kind,
)
from mmnanguard.testing.tiny_configs import TINY_DOTA_CONFIG


@pytest.mark.parametrize(
    'cfg, kind, targets',
    [
        (dict(type='GDLoss', loss_type='kld'), 'gaussian', 'rot'),
        (
            dict(type='GDLoss_v1', loss_type='kld'),
            'gaussian',
            'rot',
        ),
        (
            dict(type='GDLoss_v1', loss_type='gwd'),
            'gaussian',
            'rot',
        ),
        (
            dict(type='GDLoss_v1', loss_type='bcd'),
            'gaussian',
            'rot',
        ),
        (dict(type='SafeRotatedIoULoss'), 'rotated_box', 'rot'),
        (dict(type='RotatedIoULoss'), 'rotated_box', 'rot'),
        (dict(type='ConvexGIoULoss'), 'quad', 'point'),
    ],
)
def test_rotated_losses_are_told_by_their_behaviour(cfg, kind, targets):
    found = loss_kind(build_in_scope(cfg, 'mmrotate'), 'mmrotate')
    assert found.kind == kind
    assert found.targets.startswith(targets)
    assert found.takes_boxes


def _model(path, **overrides):
    cfg = Config.fromfile(path)
    cfg.merge_from_dict(overrides)
    init_default_scope(cfg.default_scope)
    return MODELS.build(cfg.model)


def test_the_tiny_dota_l1_loss_takes_deltas_by_design():
    assert encoded_deltas_into_box_loss(_model(TINY_DOTA_CONFIG)) == []


def test_gdloss_v1_on_encoded_deltas_is_found_with_its_fix():
    gd = dict(type='GDLoss_v1', loss_type='kld', fun='log1p', tau=1.0)
    model = _model(
        TINY_DOTA_CONFIG,
        **{'model.bbox_head.loss_bbox': dict(gd, _delete_=True)},
    )
    records = encoded_deltas_into_box_loss(model)
    assert records == [
        EncodedDeltasRecord(
            'bbox_head', 'GDLoss_v1', 'DeltaXYWHTRBBoxCoder', 'loss_bbox'
        )
    ]
    text = describe_mismatch(records[0])
    assert text.startswith('nanguard: model.bbox_head.loss_bbox (GDLoss_v1)')
    assert 'model.bbox_head.reg_decoded_bbox=True' in text
    decoded = _model(
        TINY_DOTA_CONFIG,
        **{
            'model.bbox_head.loss_bbox': dict(gd, _delete_=True),
            'model.bbox_head.reg_decoded_bbox': True,
        },
    )
    assert encoded_deltas_into_box_loss(decoded) == []
