# Copyright (c) mmnanguard contributors. All rights reserved.
"""Finding the losses of a config by what their types resolve to, with
their config paths, and the same losses in the built model."""

import torch.nn as nn
from mmdet.models.losses import FocalLoss, L1Loss
from mmengine.config import Config

from mmnanguard.analysis import (
    build_in_scope,
    find_loss_configs,
    is_loss_class,
    named_loss_modules,
    resolve_type,
)
from mmnanguard.analysis.config_path import resolve_config_path
from mmnanguard.testing import TINY_DOTA_CONFIG

ROTATED_RETINANET = (
    'mmrotate::rotated_retinanet/'
    'rotated-retinanet-rbox-le90_r50_fpn_1x_dota.py'
)


def test_losses_of_the_upstream_config():
    cfg = Config.fromfile(resolve_config_path(ROTATED_RETINANET))
    entries = find_loss_configs(cfg.model, cfg.default_scope)
    assert [(e.path, e.cls) for e in entries] == [
        ('model.bbox_head.loss_cls', FocalLoss),
        ('model.bbox_head.loss_bbox', L1Loss),
    ]
    # the head's 15 DOTA classes reach its losses
    assert entries[0].context == dict(num_classes=15)


def test_paths_match_the_built_model():
    cfg = Config.fromfile(TINY_DOTA_CONFIG)
    head = build_in_scope(cfg.model.bbox_head, cfg.default_scope)
    built = named_loss_modules(head, 'model.bbox_head')
    entries = find_loss_configs(cfg.model, cfg.default_scope)
    assert [(p, type(m)) for p, m in built] == [
        (e.path, e.cls) for e in entries
    ]


def test_resolution_follows_the_scope():
    assert resolve_type('FocalLoss', 'mmdet') is FocalLoss
    assert resolve_type('mmdet.FocalLoss', 'mmrotate') is FocalLoss
    assert resolve_type('NoSuchLoss', 'mmdet') is None
    assert resolve_type(None, 'mmdet') is None


def test_loss_class_rule():
    assert is_loss_class(FocalLoss)
    assert not is_loss_class(nn.Conv2d)
    assert not is_loss_class(resolve_type('RetinaHead', 'mmdet'))
    assert not is_loss_class('FocalLoss')  # a name, not a class
