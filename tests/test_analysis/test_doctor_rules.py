# Copyright (c) mmnanguard contributors. All rights reserved.
"""Each doctor rule on a real upstream config where it fires and one where
it stays silent."""

import pytest
import torch
from mmengine.config import Config
from mmengine.runner import Runner

from mmnanguard.analysis.config_path import resolve_config_path
from mmnanguard.analysis.doctor import run_doctor
from mmnanguard.testing.toy import toy_runner_cfg

RETINANET = 'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py'
FASTER_RCNN = 'mmdet::faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py'
FASTER_RCNN_CIOU = 'mmdet::faster_rcnn/faster-rcnn_r50_fpn_ciou_1x_coco.py'
ROTATED_RETINANET = (
    'mmrotate::rotated_retinanet/'
    'rotated-retinanet-rbox-le90_r50_fpn_1x_dota.py'
)
ROTATED_RETINANET_AMP = (
    'mmrotate::rotated_retinanet/'
    'rotated-retinanet-rbox-le90_r50_fpn_amp-1x_dota.py'
)
FCN = 'mmseg::fcn/fcn_r50-d8_4xb2-40k_cityscapes-512x1024.py'
FCN_AMP = 'mmseg::fcn/fcn_r101-d8_4xb2-amp-80k_cityscapes-512x1024.py'
BEIT_AMP = 'mmseg::beit/beit-large_upernet_8xb1-amp-160k_ade20k-640x640.py'


def findings(config, num_gpus=1, **options):
    cfg = Config.fromfile(resolve_config_path(config))
    cfg.merge_from_dict(options)
    return {f.rule: f for f in run_doctor(cfg, num_gpus=num_gpus)}


def test_lr_above_linear_scaling():
    # retinanet: lr 0.01 for 16 images; 1 GPU x 2 images is 8x too high
    found = findings(RETINANET, num_gpus=1)['lr-above-linear-scaling']
    assert found.severity == 'warning'
    assert '8x too high' in found.message
    assert 'lr=0.00125' in found.fix and 'base_batch_size=16' in found.fix
    assert 'lr-above-linear-scaling' not in findings(RETINANET, num_gpus=8)
    enabled = findings(RETINANET, **{'auto_scale_lr.enable': True})
    assert 'lr-above-linear-scaling' not in enabled


def test_warmup():
    # mmseg's 40k schedule: PolyLR only
    found = findings(FCN, num_gpus=4)['no-warmup']
    assert "['PolyLR']" in found.message and 'LinearLR' in found.fix
    assert 'no-warmup' not in findings(RETINANET, num_gpus=8)  # LinearLR
    # --auto-scale-lr on 16 images where the lr was set for 8: an error
    raised = findings(
        FCN,
        num_gpus=8,
        auto_scale_lr=dict(enable=True, base_batch_size=8),
    )['lr-raised-without-warmup']
    assert raised.severity == 'error' and '2x' in raised.message


def test_sgd_without_clip_grad():
    found = findings(RETINANET)['sgd-without-clip-grad']
    assert 'clip_grad=dict(max_norm=35' in found.fix
    assert 'sgd-without-clip-grad' not in findings(ROTATED_RETINANET)


def test_amp_rules():
    fcn_amp = findings(FCN_AMP, num_gpus=4)
    assert 'loss_scale=512' in fcn_amp['amp-static-loss-scale'].message
    assert fcn_amp['amp-static-loss-scale'].fix == (
        "optim_wrapper = dict(loss_scale='dynamic')"
    )
    # mmseg's cross-entropy returns fp32 under autocast: an fp32 island
    assert 'amp-loss-without-fp32-island' not in fcn_amp
    assert 'amp-adam-eps' not in fcn_amp  # SGD
    rotated = findings(ROTATED_RETINANET_AMP, num_gpus=8)
    assert 'amp-static-loss-scale' not in rotated  # dynamic
    island = rotated['amp-loss-without-fp32-island']
    assert island.path == 'model.bbox_head.loss_bbox'
    assert island.message.startswith('L1Loss computes in fp16')
    beit = findings(BEIT_AMP, num_gpus=8)['amp-adam-eps']
    assert 'AdamW eps=1e-08' in beit.message
    assert 'amp-adam-eps' not in findings(ROTATED_RETINANET, num_gpus=8)


def test_loss_weight_range():
    found = findings(FASTER_RCNN_CIOU)['loss-weight-range']
    assert found.path == 'model.roi_head.bbox_head.loss_bbox'
    assert 'CIoULoss has loss_weight=12' in found.message
    assert found.fix == 'model.roi_head.bbox_head.loss_bbox.loss_weight=10'
    assert 'loss-weight-range' not in findings(FASTER_RCNN)


def test_batchnorm_eps_at_small_batch():
    found = findings(FCN, num_gpus=4)['batchnorm-small-batch']
    # SyncBN in backbone and both heads, 2 images per GPU
    assert found.message.startswith('3 BatchNorm config(s) with eps=1e-05')
    assert 'model.decode_head.norm_cfg' in found.message
    big = findings(FCN, num_gpus=4, **{'train_dataloader.batch_size': 8})
    assert 'batchnorm-small-batch' not in big
    # retinanet's backbone BN is frozen (norm_eval=True)
    assert 'batchnorm-small-batch' not in findings(RETINANET)


@pytest.mark.parametrize('ignore_index, fires', [(None, True), (255, False)])
def test_label_255_without_ignore_index(
    tiny_cityscapes_root, ignore_index, fires
):
    options = {
        'train_dataloader.dataset.data_root': tiny_cityscapes_root,
        'model.decode_head.ignore_index': ignore_index,
        'model.auxiliary_head.ignore_index': ignore_index,
    }
    found = findings(FCN, num_gpus=4, **options).get('ignore-index-255')
    if not fires:
        assert found is None
        return
    assert found.severity == 'error'
    assert 'model.decode_head.ignore_index=None' in found.message
    assert 'model.auxiliary_head.ignore_index=None' in found.message
    assert '4 read' in found.message
    assert found.fix == 'model.decode_head.ignore_index=255'


def test_fragile_modules():
    found = findings(ROTATED_RETINANET)['fragile-modules']
    assert 'model.bbox_head.loss_cls (FocalLoss -> StableFocalLoss)' in (
        found.message
    )
    assert (
        'model.bbox_head.bbox_coder (DeltaXYWHTRBBoxCoder -> '
        'SafeDeltaXYWHTRBBoxCoder)' in found.message
    )
    assert found.fix == "_base_ = [..., 'mmnanguard::_base_/safe_modules.py']"
    assert 'fragile-modules' not in findings(FASTER_RCNN)


def test_fragile_modules_silent_with_the_include(tmp_path):
    config = tmp_path / 'safe.py'
    config.write_text(
        f'_base_ = [{resolve_config_path(ROTATED_RETINANET)!r}, '
        "'mmnanguard::_base_/safe_modules.py']\n"
    )
    assert 'fragile-modules' not in findings(str(config))


HBOX_RETINANET = (
    'mmrotate::rotated_retinanet/'
    'rotated-retinanet-hbox-le90_r50_fpn_1x_dota.py'
)
KEEP_EMPTY = {'train_dataloader.dataset.filter_cfg.filter_empty_gt': False}


def test_empty_gt_kept_for_a_head_that_cannot_take_it():
    """mmrotate's horizontal-anchor RetinaNet (mmdet's RetinaHead on
    rotated boxes) trains with one box but raises on an image without
    any; the upstream config filters such images out."""
    found = findings(HBOX_RETINANET, **KEEP_EMPTY)['empty-gt-kept']
    assert found.severity == 'error' and found.path == 'model.bbox_head'
    assert found.message.endswith(
        "without, it raises AttributeError: 'RotatedBoxes' object has no "
        "attribute 'new'"
    )
    assert 'filter_empty_gt=True' in found.fix
    assert 'empty-gt-kept' not in findings(HBOX_RETINANET)
    # the rotated-anchor head takes empty images, and so does YOLOX,
    # whose upstream config keeps them
    assert 'empty-gt-kept' not in findings(ROTATED_RETINANET, **KEEP_EMPTY)
    assert 'empty-gt-kept' not in findings(
        'mmdet::yolox/yolox_s_8xb8-300e_coco.py'
    )


@pytest.fixture(scope='module')
def checkpoints(tmp_path_factory):
    """Real mmengine checkpoints of a 2-iteration run, without and with
    AMP (CPU GradScaler)."""
    out = {}
    for name, wrapper in (
        ('plain', dict(type='OptimWrapper')),
        ('amp', dict(type='CPUAmpOptimWrapper', loss_scale='dynamic')),
    ):
        work_dir = str(tmp_path_factory.mktemp(name))
        wrapper['optimizer'] = dict(type='SGD', lr=0.01)
        runner = Runner(
            **toy_runner_cfg(work_dir, max_iters=2, optim_wrapper=wrapper)
        )
        runner.train()
        out[name] = f'{work_dir}/iter_2.pth'
    return out


def test_resume_without_grad_scaler(checkpoints):
    saved = torch.load(checkpoints['amp'], weights_only=False)
    assert 'loss_scaler' in saved['optimizer']  # the state to look for
    resume = dict(resume=True, load_from=checkpoints['plain'])
    found = findings(ROTATED_RETINANET_AMP, **resume)
    assert 'iter_2.pth, which holds no GradScaler state' in (
        found['resume-without-grad-scaler'].message
    )
    resume['load_from'] = checkpoints['amp']
    assert 'resume-without-grad-scaler' not in findings(
        ROTATED_RETINANET_AMP, **resume
    )
    # no AMP: nothing to restore
    resume['load_from'] = checkpoints['plain']
    assert 'resume-without-grad-scaler' not in findings(
        ROTATED_RETINANET, **resume
    )


class _Payload:
    """Unpickling this would create ``path`` (it must never run)."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, 'w'))


def test_hostile_resume_checkpoint_is_not_run(tmp_path):
    marker = tmp_path / 'ran'
    hostile = tmp_path / 'hostile.pth'
    torch.save({'optimizer': _Payload(str(marker))}, hostile)
    found = findings(
        ROTATED_RETINANET_AMP, resume=True, load_from=str(hostile)
    )['resume-without-grad-scaler']
    assert found.severity == 'info'
    assert f'cannot read the resume checkpoint {str(hostile)!r}' in (
        found.message
    )
    assert not marker.exists()
