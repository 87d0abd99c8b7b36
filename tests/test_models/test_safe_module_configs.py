# Copyright (c) mmnanguard contributors. All rights reserved.
"""The example configs of ``configs/safe_modules`` train on generated DOTA."""

import math
import os.path as osp

import pytest
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.runner import Runner

import mmnanguard  # noqa: F401  (before mmrotate.models)
from mmnanguard.testing import load_tiny_config
from mmnanguard.testing.tiny_configs import MIM_ROOT

CONFIG_DIR = osp.join(MIM_ROOT, 'configs', 'safe_modules')
CONFIGS = {
    'rotated-retinanet-rbox-le90_r18_safe_tiny-dota.py': dict(
        loss_cls='StableFocalLoss',
        loss_bbox='SafeRotatedIoULoss',
        coder='SafeDeltaXYWHTRBBoxCoder',
        keys=('loss_cls', 'loss_bbox'),
    ),
    'rotated-fcos-le90_r18_sincos_safe_tiny-dota.py': dict(
        loss_cls='StableFocalLoss',
        loss_bbox='SafeRotatedIoULoss',
        coder='SinCosAngleCoder',
        keys=('loss_cls', 'loss_bbox', 'loss_angle', 'loss_centerness'),
    ),
}


class _RecordLosses(Hook):
    """Keep every logged loss term of every iteration."""

    def __init__(self):
        self.records = []

    def after_train_iter(
        self, runner, batch_idx, data_batch=None, outputs=None
    ):
        self.records.append({k: float(v) for k, v in outputs.items()})


@pytest.mark.parametrize('name', list(CONFIGS))
def test_config_is_a_short_override_naming_the_safe_modules(name):
    cfg = Config.fromfile(osp.join(CONFIG_DIR, name))
    head = cfg.model.bbox_head
    exp = CONFIGS[name]
    assert head.loss_cls.type == exp['loss_cls']
    assert head.loss_bbox.type == exp['loss_bbox']
    coder = head.angle_coder if 'angle_coder' in head else head.bbox_coder
    assert coder.type == exp['coder']


@pytest.mark.parametrize('name', list(CONFIGS))
def test_config_trains_with_finite_losses(name, tiny_dota_root, tmp_path):
    cfg = load_tiny_config(
        osp.join(CONFIG_DIR, name), str(tmp_path), tiny_dota_root, max_iters=3
    )
    runner = Runner.from_cfg(cfg)
    recorder = _RecordLosses()
    runner.register_hook(recorder, priority='LOWEST')
    runner.train()
    assert len(recorder.records) == 3
    for record in recorder.records:
        for key in CONFIGS[name]['keys'] + ('loss',):
            assert key in record, (key, record)
            assert math.isfinite(record[key]), (key, record)
    # positives were matched: the safe regression loss really ran
    assert max(r['loss_bbox'] for r in recorder.records) > 0
    head = runner.model.bbox_head
    assert type(head.loss_cls).__name__ == CONFIGS[name]['loss_cls']
    assert type(head.loss_bbox).__name__ == CONFIGS[name]['loss_bbox']
    coder = getattr(head, 'angle_coder', None)
    if CONFIGS[name]['coder'] != 'SinCosAngleCoder':
        coder = head.bbox_coder
    assert type(coder).__name__ == CONFIGS[name]['coder']
