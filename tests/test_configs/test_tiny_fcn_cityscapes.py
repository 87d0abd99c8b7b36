# Copyright (c) mmnanguard contributors. All rights reserved.
"""The tiny mmseg config trains on the generated Cityscapes folder."""

import os.path as osp

import numpy as np
from mmengine.runner import Runner

from mmnanguard.testing import TINY_DOTA_CONFIG, load_tiny_config

TINY_CITYSCAPES_CONFIG = osp.join(
    osp.dirname(TINY_DOTA_CONFIG), 'fcn_r18-d8_tiny-cityscapes.py'
)


def test_tiny_fcn_cityscapes_trains(tiny_cityscapes_root, tmp_path):
    cfg = load_tiny_config(
        TINY_CITYSCAPES_CONFIG,
        str(tmp_path / 'work'),
        tiny_cityscapes_root,
        max_iters=3,
    )
    assert cfg.model.decode_head.num_classes == 19
    assert cfg.model.backbone.depth == 18
    runner = Runner.from_cfg(cfg)
    runner.train()
    assert runner.iter == 3
    losses, counts = runner.message_hub.get_scalar('train/loss').data
    assert len(losses) == 3 and np.isfinite(losses).all()
    # cross-entropy of a freshly initialised 19-class head is about log(19)
    decode, _ = runner.message_hub.get_scalar('train/decode.loss_ce').data
    assert 0.3 * np.log(19) < decode[0] < 3 * np.log(19)
    assert osp.isfile(osp.join(cfg.work_dir, 'iter_3.pth'))
