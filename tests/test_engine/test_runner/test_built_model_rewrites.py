# Copyright (c) mmnanguard contributors. All rights reserved.
"""What the runner reads off a built model (``num_classes``,
``angle_version``, ``ignore_index``) and the label check on the built
cross-entropy modules, on real upstream configs shrunk to ResNet-18: the
refine heads of S2ANet / R3Det, Mask R-CNN's mask head, OCRNet's list
``decode_head``, an RPN."""

import os.path as osp

import pytest
import torch
import torch.nn.functional as F
from mmdet.models.losses import CrossEntropyLoss as MMDetCrossEntropyLoss
from mmengine.config import Config
from mmengine.registry import MODELS, DefaultScope
from mmseg.models.losses import CrossEntropyLoss as MMSegCrossEntropyLoss

from mmnanguard.engine.runner import facts_from_config, read_model_facts
from mmnanguard.engine.runner.label_checks import wrap_cross_entropy
from mmnanguard.models.losses import CheckedCrossEntropyLoss
from mmnanguard.models.losses.checked_cross_entropy_loss import (
    InvalidLabelError,
)
from mmnanguard.testing.tiny_configs import MIM_ROOT

TINY = osp.join(MIM_ROOT, 'configs', 'tiny')
S2ANET = osp.join(TINY, 's2anet-le135_r18_fpn_tiny-dota.py')
R3DET = osp.join(TINY, 'r3det-oc_r18_fpn_tiny-dota.py')
MASK_RCNN = osp.join(TINY, 'mask-rcnn_r18_fpn_tiny-coco.py')
OCRNET = osp.join(TINY, 'ocrnet_r18-d8_tiny-cityscapes.py')
_BUILT = {}


def build(path: str):
    """The config and the model built from it (cached per module)."""
    if path not in _BUILT:
        cfg = Config.fromfile(path)
        with DefaultScope.overwrite_default_scope(cfg.default_scope):
            _BUILT[path] = cfg, MODELS.build(cfg.model)
    return _BUILT[path]


def rpn_config() -> Config:
    cfg = Config.fromstring(
        "_base_ = 'mmdet::rpn/rpn_r50_fpn_1x_coco.py'", '.py'
    )
    cfg.model.backbone.update(depth=18, init_cfg=None)
    cfg.model.neck.update(in_channels=[64, 128, 256, 512], out_channels=32)
    cfg.model.rpn_head.update(in_channels=32, feat_channels=32)
    return cfg


# -- facts --------------------------------------------------------------------
@pytest.mark.parametrize(
    'path, upstream',
    [
        (S2ANET, 'mmrotate::s2anet/s2anet-le135_r50_fpn_1x_dota.py'),
        (R3DET, 'mmrotate::r3det/r3det-oc_r50_fpn_1x_dota.py'),
    ],
)
def test_refine_heads(path, upstream):
    """``bbox_head_init`` / ``bbox_head_refine``: the heads that made the
    old inference refuse every S2ANet and R3Det config."""
    cfg, model = build(path)
    facts = read_model_facts(model)
    up = Config.fromstring(f'_base_ = {upstream!r}', '.py')
    assert facts.num_classes == up.model.bbox_head_init.num_classes == 15
    assert facts.num_classes_from == ('bbox_head_init', 'bbox_head_refine.0')
    assert facts.angle_version == up.angle_version
    assert facts.why_no_classes is None
    static = facts_from_config(cfg)
    assert (static.num_classes, static.angle_version) == (
        facts.num_classes,
        facts.angle_version,
    )


def test_two_stage_mask_heads():
    cfg, model = build(MASK_RCNN)
    facts = read_model_facts(model)
    # the RPN head's 1 is below the ROI heads' 3
    assert model.rpn_head.num_classes == 1
    assert facts.num_classes == 3
    assert facts.num_classes_from == (
        'roi_head.bbox_head',
        'roi_head.mask_head',
    )
    assert facts.angle_version is None
    assert facts_from_config(cfg).num_classes == 3


def test_list_decode_head():
    cfg, model = build(OCRNET)
    facts = read_model_facts(model)
    assert isinstance(cfg.model.decode_head, list)
    assert facts.num_classes == 19
    # the segmentor itself repeats its last decode head's count
    assert facts.num_classes_from == (
        'model',
        'decode_head.0',
        'decode_head.1',
    )
    assert facts.ignore_index == model.decode_head[1].ignore_index == 255
    assert facts_from_config(cfg).num_classes == 19


def test_rpn_labels_bound_nothing():
    cfg = rpn_config()
    with DefaultScope.overwrite_default_scope('mmdet'):
        model = MODELS.build(cfg.model)
    for facts in (read_model_facts(model), facts_from_config(cfg)):
        assert facts.num_classes is None
        assert 'RPN' in facts.why_no_classes


# -- the label check on built losses ----------------------------------------
def test_mask_loss_is_left_alone():
    """Mask R-CNN crashed at iteration 0 because the mask head's
    ``CrossEntropyLoss(use_mask=True)`` was swapped too."""
    _, model = build(MASK_RCNN)
    wrapped = wrap_cross_entropy(model)
    assert wrapped == ['rpn_head.loss_cls', 'roi_head.bbox_head.loss_cls']
    assert type(model.roi_head.mask_head.loss_mask) is MMDetCrossEntropyLoss
    assert wrap_cross_entropy(model) == []  # once only


def test_wrapped_loss_is_the_same_loss():
    """The wrapper computes with the very module it replaces: same value
    as before wrapping and as a float64 softmax cross-entropy; a label
    outside the classes is named."""
    upstream = MMDetCrossEntropyLoss(
        use_sigmoid=False, loss_weight=0.7, class_weight=[1.0, 2.0, 0.5, 1.0]
    )
    holder = torch.nn.Module()
    holder.loss_cls = upstream
    torch.manual_seed(0)
    score = torch.randn(6, 4)
    label = torch.tensor([0, 1, 2, 3, 3, 1])
    before = upstream(score, label)
    assert wrap_cross_entropy(holder) == ['loss_cls']
    checked = holder.loss_cls
    assert isinstance(checked, CheckedCrossEntropyLoss)
    assert checked.loss is upstream
    assert checked.class_weight == [1.0, 2.0, 0.5, 1.0]  # read through
    after = checked(score, label)
    weight = torch.tensor([1.0, 2.0, 0.5, 1.0], dtype=torch.float64)
    expected = (
        0.7
        * F.cross_entropy(
            score.double(), label, weight=weight, reduction='none'
        ).mean()
    )
    assert after.item() == pytest.approx(before.item(), rel=1e-7)
    assert after.item() == pytest.approx(expected.item(), rel=1e-6)
    with pytest.raises(InvalidLabelError, match='label value 7'):
        checked(score, torch.tensor([0, 1, 7, 3, 3, 1]))


def test_decode_head_losses_wrapped_as_mmseg():
    _, model = build(OCRNET)
    wrapped = wrap_cross_entropy(model)
    assert wrapped == [
        'decode_head.0.loss_decode',
        'decode_head.1.loss_decode',
    ]
    for head in model.decode_head:
        assert head.loss_decode.impl == 'mmseg'
        assert isinstance(head.loss_decode.loss, MMSegCrossEntropyLoss)
        assert head.loss_decode.loss_name == 'loss_ce'
    torch.manual_seed(0)
    logits = torch.randn(2, 19, 4, 4)
    label = torch.randint(0, 19, (2, 4, 4))
    label[0, 0, 0] = 255
    loss = model.decode_head[1].loss_decode(logits, label, ignore_index=255)
    expected = F.cross_entropy(
        logits.double(), label, ignore_index=255, reduction='none'
    )
    # mmseg averages over every pixel, ignored ones included
    assert loss.item() == pytest.approx(expected.mean().item(), rel=1e-6)


def test_checked_mask_loss_matches_upstream():
    """A configured ``CheckedCrossEntropyLoss(use_mask=True)`` gives
    mmdet's mask loss (it used to pass an ignore_index that mmdet's
    mask_cross_entropy refuses)."""
    torch.manual_seed(0)
    pred = torch.randn(3, 4, 5, 5)
    target = (torch.rand(3, 5, 5) > 0.5).float()
    label = torch.tensor([0, 3, 1])
    upstream = MMDetCrossEntropyLoss(use_mask=True)
    checked = CheckedCrossEntropyLoss(impl='mmdet', use_mask=True)
    chosen = pred[torch.arange(3), label].double()
    expected = F.binary_cross_entropy_with_logits(chosen, target.double())
    value = checked(pred, target, label)
    assert value.item() == pytest.approx(
        upstream(pred, target, label).item(), rel=1e-7
    )
    assert value.item() == pytest.approx(expected.item(), rel=1e-6)
