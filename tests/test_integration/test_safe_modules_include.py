# Copyright (c) mmnanguard contributors. All rights reserved.
"""The safe-modules includes on real upstream configs: the fragile modules
are swapped for the drop-ins with every argument kept and each swap logged
with its config path; losses without a CPU kernel then train on the CPU,
and a NaN that rotated RTMDet with GDLoss('kld') produces by itself is
gone, with the iterations before it unchanged."""

import glob
import json
import math
import os.path as osp
import uuid

import numpy as np
import pytest
from mmengine.config import Config
from mmengine.registry import RUNNERS

from mmnanguard.engine.hooks import NanGuardHook
from mmnanguard.models.losses import (
    SafeDiceLoss,
    SafeGDLoss,
    SafeRotatedIoULoss,
    StableFocalLoss,
)
from mmnanguard.models.task_modules import SafeDeltaXYWHTRBBoxCoder
from mmnanguard.testing import (
    TINY_COCO_CONFIG,
    TINY_DOTA_CONFIG,
    load_tiny_config,
    tensors_all_finite,
)
from mmnanguard.testing.tiny_configs import MIM_ROOT

CONFIGS = osp.join(MIM_ROOT, 'configs')
KLD_TINY = osp.join(CONFIGS, 'tiny', 'rotated-rtmdet_tiny-kld_tiny-dota.py')
KLD_SAFE = osp.join(
    CONFIGS,
    'safe_modules',
    'rotated-rtmdet_tiny-kld_safe-include_tiny-dota.py',
)
RTMDET_SAFE = osp.join(
    CONFIGS, 'safe_modules', 'rotated-rtmdet_tiny_safe-include_tiny-dota.py'
)
FCOS_SAFE = osp.join(
    CONFIGS, 'safe_modules', 'rotated-fcos-le90_r18_safe-include_tiny-dota.py'
)
# no replay of the first incident: these tests look at the losses only
NO_EXTRA_HOOKS = {'nanguard.hooks': []}


def _guard(runner):
    return next(h for h in runner.hooks if isinstance(h, NanGuardHook))


def _history(runner, key):
    """The logged value of ``key`` at every iteration."""
    values, _ = runner.message_hub.get_scalar(f'train/{key}').data
    return np.asarray(values, dtype=np.float64)


def _log_text(runner):
    (path,) = glob.glob(osp.join(runner.log_dir, '*.log'))
    with open(path) as f:
        return f.read()


def _include(tmp_path, *bases, extra=''):
    config = tmp_path / 'config.py'
    config.write_text(f'_base_ = {list(bases)!r}\n{extra}')
    return str(config)


@pytest.mark.slow
def test_safe_modules_include(broken_dota, tmp_path):
    config = _include(
        tmp_path,
        TINY_DOTA_CONFIG,
        'mmnanguard::_base_/safe_modules/rotated_retinanet.py',
    )
    cfg = Config.fromfile(config)
    # the config itself is untouched: the runner swaps the types
    assert cfg.model.bbox_head.loss_cls.type == 'mmdet.FocalLoss'
    cfg.work_dir = str(tmp_path / 'work')
    cfg.experiment_name = f'safe_include_{uuid.uuid4().hex[:8]}'
    cfg.train_dataloader.dataset.data_root = broken_dota['root'] + '/'
    cfg.train_cfg.max_epochs = 1
    runner = RUNNERS.build(cfg)
    head = runner.model.bbox_head
    assert isinstance(head.loss_cls, StableFocalLoss)
    assert (head.loss_cls.gamma, head.loss_cls.alpha) == (2.0, 0.25)
    assert isinstance(head.bbox_coder, SafeDeltaXYWHTRBBoxCoder)
    assert head.bbox_coder.angle_version == 'le90'
    runner.train()
    guard = _guard(runner)
    # P0000's zero-width box is in this epoch, yet nothing was non-finite
    assert runner.iter == 2 and guard.counters['incidents'] == 0
    assert np.isfinite(_history(runner, 'loss_bbox')).all()
    assert osp.isfile(osp.join(cfg.work_dir, 'epoch_1.pth'))


@pytest.mark.slow
def test_kld_nan_by_itself_and_finite_under_the_safe_include(
    tiny_dota_root, tmp_path
):
    # 1) protection only: mmrotate's GDLoss('kld') goes NaN by itself (no
    # fault planted) within 4 iterations, in loss_bbox; the guard skips it
    plain = _include(tmp_path, KLD_TINY, 'mmnanguard::_base_/nanguard.py')
    cfg = load_tiny_config(
        plain, str(tmp_path / 'plain'), tiny_dota_root, 4, **NO_EXTRA_HOOKS
    )
    runner = RUNNERS.build(cfg)
    assert type(runner.model.bbox_head.loss_bbox).__name__ == 'GDLoss'
    runner.train()
    guard = _guard(runner)
    # every non-finite loss is one incident; where the fp32 determinant's
    # gradient goes NaN first on a finite loss (CPU rounding), that
    # iteration is a nonfinite_grad incident of its own
    reports = [
        json.load(open(p))
        for p in sorted(
            glob.glob(osp.join(cfg.work_dir, 'nanguard', '*', 'report.json'))
        )
    ]
    by_kind = {}
    for report in reports:
        by_kind.setdefault(report['kind'], []).append(report['iteration'])
    assert set(by_kind) <= {'nonfinite_loss', 'nonfinite_grad'}
    # iteration 3 here; where exactly the fp32 determinant first cancels
    # below zero may depend on the CPU's rounding
    bad = by_kind['nonfinite_loss']
    assert len(bad) >= 1
    for report in reports:
        if report['kind'] == 'nonfinite_loss':
            assert set(report['nonfinite_terms']) == {'loss', 'loss_bbox'}
            assert math.isnan(float(report['nonfinite_terms']['loss_bbox']))
        else:
            assert report['nonfinite_terms'] == {}, report
    assert guard.counters['incidents'] == len(reports)
    report = guard.last_report
    assert report['iteration'] == max(bad)
    assert report['kind'] == 'nonfinite_loss'
    # every step was skipped with its logged values: the history holds the
    # kept iterations, all finite, and the ones before the first incident
    # in order
    dropped = sorted(
        by_kind['nonfinite_loss'] + by_kind.get('nonfinite_grad', [])
    )
    upstream = _history(runner, 'loss_bbox')
    assert len(upstream) == 4 - len(dropped), upstream
    assert np.isfinite(upstream).all(), upstream
    assert np.isfinite(_history(runner, 'loss_cls')).all()
    first = dropped[0]
    assert first >= 1  # something finite to compare with below

    # 2) the safe include: the same config plus one `_base_` entry
    cfg = load_tiny_config(
        KLD_SAFE, str(tmp_path / 'safe'), tiny_dota_root, 4, **NO_EXTRA_HOOKS
    )
    runner = RUNNERS.build(cfg)
    loss = runner.model.bbox_head.loss_bbox
    assert isinstance(loss, SafeGDLoss)
    assert (loss.loss_type, loss.fun, loss.tau, loss.loss_weight) == (
        'kld',
        'log1p',
        1.0,
        2.0,
    )
    runner.train()
    safe = _history(runner, 'loss_bbox')
    assert _guard(runner).counters['incidents'] == 0
    assert np.isfinite(safe).all() and len(safe) == 4
    # where upstream was finite, the drop-in gave upstream's values (to the
    # rounding of upstream's fp32 determinant, 1.5e-5 at iteration 2)
    np.testing.assert_allclose(safe[:first], upstream[:first], rtol=1e-4)
    assert tensors_all_finite(runner.model.state_dict())
    assert 'model.bbox_head.loss_bbox: GDLoss -> SafeGDLoss' in _log_text(
        runner
    )


@pytest.mark.parametrize(
    'config,swapped',
    [
        (
            RTMDET_SAFE,
            [
                'model.bbox_head.loss_bbox: RotatedIoULoss -> '
                'SafeRotatedIoULoss'
            ],
        ),
        (
            FCOS_SAFE,
            [
                'model.bbox_head.loss_cls: mmdet.FocalLoss -> StableFocalLoss',
                'model.bbox_head.loss_bbox: RotatedIoULoss -> '
                'SafeRotatedIoULoss',
            ],
        ),
    ],
)
@pytest.mark.slow
def test_upstream_rotated_iou_loss_trains_on_the_cpu(
    config, swapped, tiny_dota_root, tmp_path
):
    cfg = load_tiny_config(
        config, str(tmp_path), tiny_dota_root, 2, **NO_EXTRA_HOOKS
    )
    # the upstream loss, whose mmcv kernel is CUDA-only, is in the config
    upstream = cfg.model.bbox_head.loss_bbox
    assert upstream.type == 'RotatedIoULoss'
    runner = RUNNERS.build(cfg)
    loss = runner.model.bbox_head.loss_bbox
    assert isinstance(loss, SafeRotatedIoULoss)
    assert loss.mode == upstream.get('mode', 'log')
    assert loss.loss_weight == upstream.loss_weight
    runner.train()
    assert runner.iter == 2 and _guard(runner).counters['incidents'] == 0
    bbox = _history(runner, 'loss_bbox')
    assert np.isfinite(_history(runner, 'loss')).all()
    assert np.isfinite(bbox).all() and bbox.max() > 0  # positives matched
    text = _log_text(runner)
    for line in swapped:
        assert line in text, line


def _build(config, tmp_path, **overrides):
    cfg = Config.fromfile(config)
    cfg.work_dir = str(tmp_path / 'work')
    # unique: mmengine reuses the logger (and its log file) of a name it
    # has seen, and every config here is called config.py
    cfg.experiment_name = f'safe_modules_{uuid.uuid4().hex[:8]}'
    cfg.merge_from_dict(overrides)
    return RUNNERS.build(cfg)


def test_mmdet_bare_focal_loss_is_swapped_in_the_mmdet_scope(tmp_path):
    config = _include(
        tmp_path, TINY_COCO_CONFIG, 'mmnanguard::_base_/safe_modules.py'
    )
    runner = _build(config, tmp_path)
    assert runner.cfg.default_scope == 'mmdet'
    loss = runner.model.bbox_head.loss_cls
    assert isinstance(loss, StableFocalLoss)
    head_cfg = runner.cfg.model.bbox_head.loss_cls
    assert head_cfg.type == 'FocalLoss'  # bare, as mmdet's configs spell it
    for key in ('gamma', 'alpha', 'loss_weight', 'use_sigmoid'):
        assert getattr(loss, key) == head_cfg[key], key
    assert 'model.bbox_head.loss_cls: FocalLoss -> StableFocalLoss' in (
        _log_text(runner)
    )


MMSEG = 'mmseg::unet/unet-s5-d16_fcn_4xb4-ce-1.0-dice-3.0-40k_stare-128x128.py'


def test_mmseg_dice_loss_is_swapped_with_its_arguments(tmp_path):
    # UNet on STARE: [CrossEntropyLoss, DiceLoss(loss_weight=3.0)], DiceLoss
    # bare in the mmseg scope
    config = _include(tmp_path, MMSEG, 'mmnanguard::_base_/safe_modules.py')
    runner = _build(config, tmp_path)
    ce, dice = runner.model.decode_head.loss_decode
    assert isinstance(dice, SafeDiceLoss)
    assert (dice.loss_weight, dice.loss_name) == (3.0, 'loss_dice')
    assert (dice.eps, dice.ignore_index, dice.use_sigmoid) == (1e-3, 255, True)
    assert ce.loss_name == 'loss_ce'
    text = _log_text(runner)
    assert 'model.decode_head.loss_decode[1]: DiceLoss -> SafeDiceLoss' in text


def test_mmseg_focal_loss_is_not_swapped(tmp_path):
    # a bare 'FocalLoss' in an mmseg config is mmseg's loss, not mmdet's
    from mmseg.models.losses import FocalLoss as MMSegFocalLoss

    config = _include(
        tmp_path,
        osp.join(CONFIGS, 'tiny', 'fcn_r18-d8_tiny-cityscapes.py'),
        'mmnanguard::_base_/safe_modules.py',
        extra='model = dict(decode_head=dict(loss_decode=dict(_delete_=True, '
        "type='FocalLoss', use_sigmoid=True, loss_weight=1.0)))\n",
    )
    runner = _build(config, tmp_path)
    assert isinstance(runner.model.decode_head.loss_decode, MMSegFocalLoss)
