# Copyright (c) mmnanguard contributors. All rights reserved.
"""The lr rule on upstream configs: no false alarm when they are trained
as their README says or with an lr scaled by hand to the batch (the rule
it applied is named), the alarm kept for an unscaled SGD lr, and the rule
chosen by the family of the built optimizer."""

import math

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import OPTIMIZERS

from mmnanguard.analysis.config_path import resolve_config_path
from mmnanguard.analysis.doctor import run_doctor

RETINANET = 'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py'
FASTER_RCNN = 'mmdet::faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py'
DINO = 'mmdet::dino/dino-4scale_r50_8xb2-12e_coco.py'
DETR = 'mmdet::detr/detr_r50_8xb2-150e_coco.py'

#: config -> (optimizer family, the lr its files write for
#: base_batch_size 16, images per GPU, GPUs in its README)
UPSTREAM = {
    RETINANET: ('SGD', 0.01, 2, 8),
    FASTER_RCNN: ('SGD', 0.02, 2, 8),
    DINO: ('AdamW', 1e-4, 2, 8),
    DETR: ('AdamW', 1e-4, 2, 8),
}
LR_RULES = ('lr-above-linear-scaling', 'lr-scaling-rule')


def _findings(config, num_gpus=1, **options):
    cfg = Config.fromfile(resolve_config_path(config))
    cfg.merge_from_dict(options)
    return {f.rule: f for f in run_doctor(cfg, num_gpus=num_gpus)}


def _user_config(tmp_path, base, text):
    path = tmp_path / 'user_cfg.py'
    path.write_text(f'_base_ = {base!r}\n{text}\n')
    return {f.rule: f for f in run_doctor(Config.fromfile(str(path)))}


@pytest.mark.parametrize('config', list(UPSTREAM))
def test_trained_as_the_readme_says_no_lr_finding(config):
    family, lr, per_gpu, gpus = UPSTREAM[config]
    cfg = Config.fromfile(resolve_config_path(config))
    # the values the table is about, read off the upstream file
    assert cfg.optim_wrapper.optimizer.type == family
    assert cfg.optim_wrapper.optimizer.lr == lr
    assert cfg.train_dataloader.batch_size == per_gpu
    assert cfg.auto_scale_lr.base_batch_size == per_gpu * gpus
    found = _findings(config, num_gpus=gpus)
    assert not set(LR_RULES) & set(found)


@pytest.mark.parametrize('config', [RETINANET, FASTER_RCNN])
def test_sgd_lr_scaled_by_hand_passes_and_names_the_linear_rule(config):
    _, lr, per_gpu, gpus = UPSTREAM[config]
    scaled = lr * per_gpu / (per_gpu * gpus)  # one GPU
    found = _findings(config, **{'optim_wrapper.optimizer.lr': scaled})
    assert 'lr-above-linear-scaling' not in found
    info = found['lr-scaling-rule']
    assert info.severity == 'info'
    assert f'lr {scaled:g} is {lr:g} ({config.split("/")[-1]}' in info.message
    assert 'linear-scaling rule (x 2/16) for SGD' in info.message


def test_retinanet_scaled_in_a_users_file_passes(tmp_path):
    # the case: RetinaNet writes 0.01 over schedule_1x.py's 0.02,
    # both for 16 images; 0.00125 is the RetinaNet lr for 2
    found = _user_config(
        tmp_path, RETINANET, 'optim_wrapper = dict(optimizer=dict(lr=0.00125))'
    )
    assert 'lr-above-linear-scaling' not in found
    assert 'retinanet_r50_fpn_1x_coco.py' in found['lr-scaling-rule'].message


@pytest.mark.parametrize('config', [RETINANET, FASTER_RCNN])
def test_sgd_lr_left_unscaled_is_still_too_high(config):
    _, lr, per_gpu, gpus = UPSTREAM[config]
    found = _findings(config)  # 1 GPU x 2 with the 8-GPU lr
    alarm = found['lr-above-linear-scaling']
    assert alarm.severity == 'warning'
    assert f'{gpus}x too high' in alarm.message
    assert 'linear-scaling rule (x 2/16) for SGD' in alarm.message
    assert f'lr={lr / gpus:.3g}' in alarm.fix
    assert 'lr-scaling-rule' not in found


def test_an_lr_set_outside_the_files_is_checked_from_the_files_lr():
    # --cfg-options lr=0.01 on Faster R-CNN (0.02 for 16): 2 images take
    # 0.0025, so 0.01 is 4x the rule
    found = _findings(FASTER_RCNN, **{'optim_wrapper.optimizer.lr': 0.01})
    alarm = found['lr-above-linear-scaling']
    assert 'lr 0.01 is not in the config files, whose lr 0.02 (' in (
        alarm.message
    )
    assert '4x too high' in alarm.message and 'lr=0.0025' in alarm.fix


@pytest.mark.parametrize('config', [DINO, DETR])
def test_adamw_on_one_gpu_unscaled_or_square_root_passes(config):
    _, lr, per_gpu, gpus = UPSTREAM[config]
    kept = _findings(config)
    assert 'lr-above-linear-scaling' not in kept
    assert 'no-scaling rule (x 1) for AdamW' in kept['lr-scaling-rule'].message
    root = lr * math.sqrt(per_gpu / (per_gpu * gpus))
    rooted = _findings(config, **{'optim_wrapper.optimizer.lr': root})
    assert 'lr-above-linear-scaling' not in rooted
    message = rooted['lr-scaling-rule'].message
    assert f'is {lr:g} (' in message
    assert 'square-root rule (x sqrt(2/16)) for AdamW' in message


def test_mmrotate_adamw_config_has_no_lr_alarm():
    # mmrotate sets no base_batch_size: what was assumed is said instead
    config = 'mmrotate::rotated_rtmdet/rotated_rtmdet_l-3x-dota.py'
    cfg = Config.fromfile(resolve_config_path(config))
    assert cfg.optim_wrapper.optimizer.type == 'AdamW'
    assert 'auto_scale_lr' not in cfg
    found = _findings(config)
    assert not set(LR_RULES) & set(found)
    batch = cfg.train_dataloader.batch_size
    assumed = found['lr-scaling-assumed'].message
    assert f'total batch of {batch} (1 GPU x {batch})' in assumed


@OPTIMIZERS.register_module(force=True)
class HouseSGD(torch.optim.SGD):
    """A registered SGD under another name: judged as SGD."""


@pytest.mark.parametrize(
    'optimizer, rule',
    [
        (dict(type='HouseSGD', lr=0.01), 'lr-above-linear-scaling'),
        (dict(type='Adadelta', lr=1.0), 'lr-scaling-rule'),
        (dict(type='Adagrad', lr=0.01), 'lr-scaling-rule'),
        (dict(type='RMSprop', lr=0.01), 'lr-scaling-unknown'),
    ],
)
def test_the_family_is_read_off_the_built_optimizer(optimizer, rule):
    found = _findings(
        RETINANET, optim_wrapper=dict(optimizer=dict(optimizer, _delete_=True))
    )
    assert rule in found
    assert not set(LR_RULES + ('lr-scaling-unknown',)) - {rule} & set(found)
    name = optimizer['type']
    if rule == 'lr-scaling-rule':
        assert f'no-scaling rule (x 1) for {name}' in found[rule].message
    if rule == 'lr-scaling-unknown':
        assert f'no lr scaling rule is known for {name}' in found[rule].message
    if name == 'HouseSGD':
        assert 'for HouseSGD: 8x too high' in found[rule].message
