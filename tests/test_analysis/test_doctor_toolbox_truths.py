# Copyright (c) mmnanguard contributors. All rights reserved.
"""The doctor is true on configs we did not write: an lr scaled by hand
for a smaller batch, warmup done by a scheduler hook, a head without
``in_channels``, a box loss fed encoded deltas."""

import pytest
import torch.nn as nn
from mmengine.config import Config
from mmengine.hooks import ParamSchedulerHook
from mmengine.registry import HOOKS

from mmnanguard.analysis.doctor import run_doctor
from mmnanguard.analysis.doctor.empty_gt_probe import (
    CannotProbe,
    level_channels,
)
from mmnanguard.testing.tiny_configs import TINY_COCO_CONFIG

VOC = 'mmdet::pascal_voc/faster-rcnn_r50_fpn_1x_voc0712.py'


def _config(tmp_path, text, name='cfg.py'):
    path = tmp_path / name
    path.write_text(text)
    return Config.fromfile(str(path))


def _rules(findings):
    return {f.rule: f for f in findings}


def test_a_voc_lr_scaled_by_hand_is_not_called_too_high(tmp_path):
    # VOC sets lr 0.01 for base_batch_size 16 (8 GPUs x 2); a batch of 2
    # takes 0.01 * 2 / 16 by the linear-scaling rule
    cfg = _config(
        tmp_path,
        f'_base_ = {VOC!r}\noptim_wrapper = dict(optimizer=dict(lr=0.00125))',
    )
    assert cfg.train_dataloader.batch_size == 2
    assert cfg.auto_scale_lr.base_batch_size == 16
    assert 'lr-above-linear-scaling' not in _rules(run_doctor(cfg))


def test_an_lr_changed_but_not_to_the_scaled_value_is_still_checked(
    tmp_path,
):
    # 0.02 is not 0.01 scaled to a batch of 2: base_batch_size describes
    # it (as mmdet's RetinaNet changes schedule_1x's 0.02 to 0.01 for 16)
    cfg = _config(
        tmp_path,
        f'_base_ = {VOC!r}\noptim_wrapper = dict(optimizer=dict(lr=0.02))',
    )
    found = _rules(run_doctor(cfg))['lr-above-linear-scaling']
    assert '8x too high' in found.message
    assert f'lr={0.02 * 2 / 16:.3g}' in found.fix


def test_without_base_batch_size_the_assumption_is_said(tmp_path):
    cfg = Config.fromfile(TINY_COCO_CONFIG)
    cfg.pop('auto_scale_lr')
    found = _rules(run_doctor(cfg))['lr-scaling-assumed']
    assert found.severity == 'info'
    total = cfg.train_dataloader.batch_size
    assert f'total batch of {total}' in found.message
    assert 'not checked' in found.message


@HOOKS.register_module(force=True)
class WarmingSchedulerHook(ParamSchedulerHook):
    """Sets the lr itself each iteration, warming up over warmup_iters
    (as mmyolo's YOLOv5ParamSchedulerHook does)."""

    def __init__(self, warmup_iters: int = 100):
        self.warmup_iters = warmup_iters

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        factor = min(1.0, (runner.iter + 1) / max(self.warmup_iters, 1))
        for group in runner.optim_wrapper.optimizer.param_groups:
            group['lr'] = group['initial_lr'] * factor


def _with_hook(hook):
    cfg = Config.fromfile(TINY_COCO_CONFIG)
    cfg.param_scheduler = None
    cfg.default_hooks.param_scheduler = hook
    return cfg


def test_warmup_in_a_built_scheduler_hook_is_recognised():
    findings = run_doctor(
        _with_hook(dict(type='WarmingSchedulerHook', warmup_iters=100))
    )
    assert 'no-warmup' not in _rules(findings)
    assert not any('LinearLR' in f.fix for f in findings)
    said = _rules(findings)['warmup-in-hook']
    assert said.severity == 'info'
    assert 'WarmingSchedulerHook: warmup_iters=100' in said.message
    assert 'read off the built hook' in said.message


def test_a_scheduler_hook_without_warmup_gets_its_own_fix():
    findings = run_doctor(
        _with_hook(dict(type='WarmingSchedulerHook', warmup_iters=0))
    )
    found = _rules(findings)['no-warmup']
    assert 'WarmingSchedulerHook' in found.message
    assert 'built' in found.message
    assert 'LinearLR' not in found.fix
    assert found.path == 'default_hooks.param_scheduler'


def test_an_unbuildable_yolo_hook_is_not_called_no_warmup():
    # mmyolo's hook, as its YOLOv5 config writes it (warmup left at the
    # class defaults); where mmyolo imports it is built and read instead
    findings = run_doctor(
        _with_hook(
            dict(
                type='YOLOv5ParamSchedulerHook',
                scheduler_type='linear',
                lr_factor=0.01,
                max_epochs=300,
            )
        )
    )
    assert 'no-warmup' not in _rules(findings)
    assert not any('LinearLR' in f.fix for f in findings)
    said = _rules(findings)
    if HOOKS.get('YOLOv5ParamSchedulerHook') is None:
        assert 'not registered here' in said['warmup-unknown'].message
    else:  # mmyolo imports: its defaults are read off the built hook
        assert 'warmup_epochs=3' in said['warmup-in-hook'].message


class _HeadModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.in_channels = [32, 64, 128]


def test_level_channels_read_the_head_module_or_say_why_not():
    from mmengine.registry import DefaultScope

    from mmnanguard.config_walk import build_in_scope

    with DefaultScope.overwrite_default_scope('mmdet'):
        head = build_in_scope(
            dict(type='RetinaHead', num_classes=2, in_channels=16), 'mmdet'
        )
    assert level_channels(head, 3) == [16, 16, 16]
    yolo_like = nn.Module()
    yolo_like.head_module = _HeadModule()
    assert level_channels(yolo_like, 3) == [32, 64, 128]
    with pytest.raises(CannotProbe, match='cannot probe it: Module has no'):
        level_channels(nn.Module(), 3)
