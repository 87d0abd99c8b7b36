# Copyright (c) mmnanguard contributors. All rights reserved.
"""A loss's kind is decided by calling the built module, not from its
name; the heads whose box loss is fed encoded deltas are found on the
built model."""

import os.path as osp

import pytest
import torch
import torch.nn as nn
from mmengine.config import Config
from mmengine.registry import MODELS, init_default_scope

from mmnanguard.config_walk import build_in_scope
from mmnanguard.models.loss_kind import (
    EncodedDeltasRecord,
    describe_mismatch,
    encoded_deltas_into_box_loss,
    loss_kind,
    takes_boxes,
)
from mmnanguard.testing.tiny_configs import TINY_COCO_CONFIG

MMDET_CONFIGS = osp.join(
    osp.dirname(__import__('mmdet').__file__), '.mim', 'configs'
)


@pytest.mark.parametrize(
    'cfg, scope, kind, targets',
    [
        (dict(type='DistributionFocalLoss'), 'mmdet', 'distribution', 'dist'),
        (dict(type='QualityFocalLoss'), 'mmdet', 'classification', '(class'),
        (dict(type='FocalLoss'), 'mmdet', 'classification', 'class'),
        (dict(type='VarifocalLoss'), 'mmdet', 'classification', 'one-hot'),
        (dict(type='GIoULoss'), 'mmdet', 'box', 'boxes xyxy'),
        (dict(type='CIoULoss'), 'mmdet', 'box', 'boxes xyxy'),
        (dict(type='L1Loss'), 'mmdet', 'regression', 'any'),
        (dict(type='SmoothL1Loss'), 'mmdet', 'regression', 'any'),
    ],
)
def test_upstream_losses_are_told_by_their_behaviour(
    cfg, scope, kind, targets
):
    found = loss_kind(build_in_scope(cfg, scope), scope)
    assert found.kind == kind
    assert found.targets.startswith(targets)
    assert found.takes_boxes == (
        kind in ('box', 'rotated_box', 'gaussian', 'quad')
    )


class FocalBoxLoss(nn.Module):
    """Named like a classification loss, computes 1 - IoU of xyxy boxes."""

    def forward(self, pred, target):
        lt = torch.max(pred[:, :2], target[:, :2])
        rb = torch.min(pred[:, 2:], target[:, 2:])
        inter = (rb - lt).clamp(min=0).prod(1)
        area = lambda b: (b[:, 2:] - b[:, :2]).prod(1)  # noqa: E731
        return (1 - inter / (area(pred) + area(target) - inter)).mean()


class IoUCrossEntropyLoss(nn.Module):
    """Named like a box loss, is a plain cross-entropy on class indices."""

    def forward(self, scores, labels):
        return nn.functional.cross_entropy(scores, labels)


class GIoUL1Loss(nn.Module):
    """Named like a box loss, is element-wise."""

    def forward(self, pred, target):
        return (pred - target).abs().mean()


def test_the_name_does_not_decide():
    assert loss_kind(FocalBoxLoss()).kind == 'box'
    assert takes_boxes(FocalBoxLoss())
    assert loss_kind(IoUCrossEntropyLoss()).kind == 'classification'
    assert loss_kind(GIoUL1Loss()).kind == 'regression'
    assert not takes_boxes(GIoUL1Loss())


def test_a_loss_that_takes_nothing_known_names_its_class():
    class Heatmap(nn.Module):
        def forward(self, heatmaps, target, weights):
            # (N, K, H, W) heatmaps only
            diff = heatmaps.flatten(2) - target.flatten(2)
            return (diff**2 * weights.unsqueeze(-1)).mean()

    with pytest.raises(ValueError, match='nanguard: cannot tell .*Heatmap'):
        loss_kind(Heatmap())
    assert not takes_boxes(Heatmap())


def test_probes_leave_an_unexpected_error_alone():
    class Broken(nn.Module):
        def forward(self, pred, target):
            raise KeyError('a bug of the loss, not a wrong input form')

    with pytest.raises(KeyError):
        loss_kind(Broken())


def _model(path, **overrides):
    cfg = Config.fromfile(path)
    cfg.merge_from_dict(overrides)
    init_default_scope(cfg.default_scope)
    return MODELS.build(cfg.model)


def test_giou_on_deltas_in_a_roi_head_and_a_dense_head():
    dense = _model(
        TINY_COCO_CONFIG,
        **{'model.bbox_head.loss_bbox': dict(type='GIoULoss', _delete_=True)},
    )
    assert [r.loss_type for r in encoded_deltas_into_box_loss(dense)] == [
        'GIoULoss'
    ]
    giou = osp.join(
        MMDET_CONFIGS, 'faster_rcnn', 'faster-rcnn_r50_fpn_giou_1x_coco.py'
    )
    assert encoded_deltas_into_box_loss(_model(giou)) == []
    wrong = _model(
        giou, **{'model.roi_head.bbox_head.reg_decoded_bbox': False}
    )
    (record,) = encoded_deltas_into_box_loss(wrong)
    assert record.head == 'roi_head.bbox_head'
    assert 'model.roi_head.bbox_head.reg_decoded_bbox=True' in (
        describe_mismatch(record)
    )


def test_heads_that_decode_on_their_own_and_element_wise_losses_pass():
    # GFL decodes its boxes itself; its reg_decoded_bbox (False) is unused
    gfl = osp.join(MMDET_CONFIGS, 'gfl', 'gfl_r50_fpn_1x_coco.py')
    assert not _model(gfl).bbox_head.reg_decoded_bbox
    assert encoded_deltas_into_box_loss(_model(gfl)) == []
    # the tiny config's L1 loss takes the deltas by design
    assert encoded_deltas_into_box_loss(_model(TINY_COCO_CONFIG)) == []


def test_mismatch_names_an_indexed_head():
    record = EncodedDeltasRecord(
        'roi_head.bbox_head.1', 'GIoULoss', 'DeltaXYWHBBoxCoder'
    )
    assert 'model.roi_head.bbox_head[1].reg_decoded_bbox=True' in (
        describe_mismatch(record)
    )


def test_probing_leaves_a_stateful_loss_as_it_was():
    # GHMC with momentum keeps a running gradient-density histogram
    ghmc = build_in_scope(dict(type='GHMC', momentum=0.75), 'mmdet')
    before = ghmc.acc_sum.clone()
    assert loss_kind(ghmc).targets.startswith('one-hot')
    assert torch.equal(ghmc.acc_sum, before)
