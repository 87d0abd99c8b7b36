# Copyright (c) mmnanguard contributors. All rights reserved.
"""The rotated RetinaNet safe-modules include: the upstream config's focal
loss and box coder are swapped for the safe drop-ins, and the zero-width
box that made the loss infinite under the plain include trains finitely."""

import os.path as osp

import numpy as np
from mmengine.config import Config
from mmengine.registry import RUNNERS

from mmnanguard.engine.hooks import NanGuardHook
from mmnanguard.models.losses import StableFocalLoss
from mmnanguard.models.task_modules import SafeDeltaXYWHTRBBoxCoder
from mmnanguard.testing import TINY_DOTA_CONFIG


def test_safe_modules_include(broken_dota, tmp_path):
    config = tmp_path / 'safe.py'
    config.write_text(
        f'_base_ = [{TINY_DOTA_CONFIG!r}, '
        "'mmnanguard::_base_/safe_modules/rotated_retinanet.py']\n"
    )
    cfg = Config.fromfile(str(config))
    # the config itself is untouched: the runner swaps the types
    assert cfg.model.bbox_head.loss_cls.type == 'mmdet.FocalLoss'
    cfg.work_dir = str(tmp_path / 'work')
    cfg.experiment_name = 'safe_include'
    cfg.train_dataloader.dataset.data_root = broken_dota['root'] + '/'
    cfg.train_cfg.max_epochs = 1
    runner = RUNNERS.build(cfg)
    head = runner.model.bbox_head
    assert isinstance(head.loss_cls, StableFocalLoss)
    assert (head.loss_cls.gamma, head.loss_cls.alpha) == (2.0, 0.25)
    assert isinstance(head.bbox_coder, SafeDeltaXYWHTRBBoxCoder)
    assert head.bbox_coder.angle_version == 'le90'
    runner.train()
    guard = next(h for h in runner.hooks if isinstance(h, NanGuardHook))
    # P0000's zero-width box is in this epoch, yet nothing was non-finite
    assert runner.iter == 2 and guard.counters['incidents'] == 0
    losses, _ = runner.message_hub.get_scalar('train/loss_bbox').data
    assert np.isfinite(losses).all()
    assert osp.isfile(osp.join(cfg.work_dir, 'epoch_1.pth'))
