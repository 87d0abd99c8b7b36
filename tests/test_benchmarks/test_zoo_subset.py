# Copyright (c) mmnanguard contributors. All rights reserved.
"""A fast subset of ``benchmarks/zoo.py``: one upstream config per family
group, shrunk by ``mmnanguard.testing.shrink``, trained in-process for two
iterations with the include and a fault planted at iteration 1.

The configs are upstream's own files, loaded through a two-line config
whose ``_base_`` lists them and ``mmnanguard::_base_/nanguard.py``:

* mmdet two-stage with a mask head: Mask R-CNN (a mask
  ``CrossEntropyLoss(use_mask=True)`` next to the class-label ones);
* mmdet one-stage: RTMDet-tiny (SyncBN, an ``EMAHook``, a pipeline switch);
* mmrotate refine detector: S2ANet (``bbox_head_init``/``bbox_head_refine``,
  no ``bbox_head``);
* mmseg: OCRNet (a list-valued ``decode_head`` on HRNet).

Each cell's result is checked against what must hold, and the incident
report and the checkpoint are read back from disk here, independently of
the cell's own checks.
"""

import glob
import json
import os.path as osp
import sys

import pytest
import torch

BENCHMARKS = osp.join(
    osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))), 'benchmarks'
)
sys.path.insert(0, BENCHMARKS)

from zoo_cell import classify_error, run_cell  # noqa: E402

from mmnanguard.testing.shrink import (  # noqa: E402
    scale_image_sizes,
    shrink_model,
)

MAX_ITERS = 2
FAULT_ITER = 1
#: (config, fault, built backbone class, its depth or None, EMA expected)
SUBSET = [
    (
        'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py',
        'nan_grad',
        'ResNet',
        18,
        False,
    ),
    (
        'mmdet::rtmdet/rtmdet_tiny_8xb32-300e_coco.py',
        'inf_loss',
        'CSPNeXt',
        None,
        True,
    ),
    (
        'mmrotate::s2anet/s2anet-le90_r50_fpn_1x_dota.py',
        'inf_loss',
        'ResNet',
        18,
        False,
    ),
    (
        'mmseg::ocrnet/ocrnet_hr18_4xb2-80k_cityscapes-512x1024.py',
        'nan_grad',
        'HRNet',
        None,
        False,
    ),
]
KINDS = dict(inf_loss='nonfinite_loss', nan_grad='nonfinite_grad')


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
    """Generated data sets shared by the cells (each kind on first use)."""
    return str(tmp_path_factory.mktemp('zoo_data'))


@pytest.mark.parametrize(
    'config,fault,backbone,depth,ema',
    SUBSET,
    ids=[c[0].split('/')[0] for c in SUBSET],
)
@pytest.mark.slow
def test_zoo_cell_skips_the_fault_and_stays_finite(
    tmp_path, data_dir, config, fault, backbone, depth, ema
):
    work_dir = str(tmp_path / 'run')
    cell = run_cell(
        config,
        work_dir,
        data_dir,
        fault=fault,
        max_iters=MAX_ITERS,
        fault_iter=FAULT_ITER,
    )
    assert cell['status'] == 'pass', cell.get('error') or cell.get('checks')
    # shrunk as promised: the built model, not the config, says so
    assert cell['backbone'] == backbone
    assert cell['backbone_depth'] == depth
    assert cell['sync_bn_modules'] == 0
    assert cell['ema'] is ema
    # iteration 0 stepped, the faulty iteration 1 did not
    assert cell['changed_params'][0] > 0
    assert cell['changed_params'][FAULT_ITER] == 0
    assert cell['final_iter'] == MAX_ITERS
    # the incident report on disk: the planted fault, in its iteration
    reports = sorted(glob.glob(osp.join(work_dir, 'nanguard', '*', '*.json')))
    reports = [p for p in reports if p.endswith('report.json')]
    assert len(reports) == 1
    with open(reports[0]) as f:
        report = json.load(f)
    assert report['iteration'] == FAULT_ITER
    assert report['kind'] == KINDS[fault]
    assert report['action'] == 'skip'
    # the checkpoint on disk: every tensor finite, one step skipped
    ckpt = torch.load(
        osp.join(work_dir, f'iter_{MAX_ITERS}.pth'),
        map_location='cpu',
        weights_only=False,
    )
    tensors = list(ckpt['state_dict'].values())
    if ema:
        tensors += list(ckpt['ema_state_dict'].values())
    assert tensors and all(
        bool(torch.isfinite(t).all()) for t in tensors if t.is_floating_point()
    )
    assert ckpt['nanguard']['counters']['skipped'] == 1
    assert ckpt['nanguard']['counters']['incidents'] == 1


def test_shrink_maps_resnet_channels_to_resnet18():
    model = dict(
        backbone=dict(
            type='ResNeXt',
            depth=101,
            groups=64,
            base_width=4,
            out_indices=(1, 2, 3),
            norm_cfg=dict(type='SyncBN', requires_grad=True),
            init_cfg=dict(type='Pretrained', checkpoint='open-mmlab://x'),
        ),
        neck=dict(type='ChannelMapper', in_channels=[512, 1024, 2048]),
        bbox_head=dict(
            type='X', init_cfg=[dict(type='Normal'), dict(type='Pretrained')]
        ),
    )
    notes = shrink_model(model)
    backbone = model['backbone']
    assert backbone == dict(
        type='ResNet',
        depth=18,
        out_indices=(1, 2, 3),
        norm_cfg=dict(type='BN', requires_grad=True),
        init_cfg=None,
    )
    # ResNet-18 stage widths 64 * 2**i for the stages 1, 2, 3
    assert model['neck']['in_channels'] == [64 * 2**i for i in (1, 2, 3)]
    assert model['bbox_head']['init_cfg'] == [dict(type='Normal')]
    assert any('SyncBN -> BN' in n for n in notes)


def test_shrink_maps_heads_without_neck_and_keeps_deformable_backbones():
    # mmseg d8: no neck, the heads read the backbone; dilations are kept
    model = dict(
        backbone=dict(
            type='mmseg.ResNetV1c',
            depth=50,
            dilations=(1, 1, 2, 4),
            strides=(1, 2, 1, 1),
        ),
        decode_head=[
            dict(type='FCNHead', in_channels=1024, in_index=2),
            dict(type='OCRHead', in_channels=2048, in_index=3),
        ],
        auxiliary_head=dict(type='FCNHead', in_channels=1024),
    )
    shrink_model(model)
    assert model['backbone']['type'] == 'mmseg.ResNetV1c'
    assert model['backbone']['dilations'] == (1, 1, 2, 4)
    assert [h['in_channels'] for h in model['decode_head']] == [256, 512]
    assert model['auxiliary_head']['in_channels'] == 256
    # KNet: a head nested in the decode head reads the backbone (it has an
    # in_index); the kernel update heads (256 internal channels) do not
    knet = dict(
        backbone=dict(type='ResNetV1c', depth=50),
        decode_head=dict(
            type='IterativeDecodeHead',
            kernel_update_head=[dict(in_channels=256, out_channels=256)],
            kernel_generate_head=dict(in_channels=2048, in_index=3),
        ),
    )
    shrink_model(knet)
    head = knet['decode_head']
    assert head['kernel_generate_head']['in_channels'] == 512
    assert head['kernel_update_head'][0]['in_channels'] == 256
    # ResNet-18's BasicBlock takes no deformable convolution: kept as is
    dcn = dict(
        backbone=dict(
            type='ResNet', depth=50, dcn=dict(type='DCN'), init_cfg=None
        ),
        neck=dict(in_channels=[256, 512, 1024, 2048]),
    )
    shrink_model(dcn)
    assert dcn['backbone']['depth'] == 50
    assert dcn['neck']['in_channels'] == [256, 512, 1024, 2048]


def test_scale_image_sizes_by_one_factor():
    pipeline = [
        dict(type='Resize', scale=(1333, 800), keep_ratio=True),
        dict(type='RandomCrop', crop_size=(384, 600)),
        dict(type='Pad', size_divisor=32),
    ]
    preprocessor = dict(size=(800, 800))
    backbone = dict(type='VisionTransformer', img_size=(512, 512))
    scale_image_sizes(
        [pipeline],
        dict(data_preprocessor=preprocessor, backbone=backbone),
        target=256,
    )
    f = 256 / 1333

    def expected(v):  # nearest multiple of 32, at least 32
        return max(32, round(v * f / 32) * 32)

    assert pipeline[0]['scale'] == (256, expected(800)) == (256, 160)
    assert pipeline[1]['crop_size'] == (expected(384), expected(600))
    assert pipeline[2] == dict(type='Pad', size_divisor=32)
    assert preprocessor['size'] == (160, 160)
    assert backbone['img_size'] == (expected(512), expected(512)) == (96, 96)


def test_scale_image_sizes_takes_the_smallest_resize_target():
    # DETR-style choice: (400, 4200) bounds only the short side
    pipeline = [
        dict(type='RandomChoiceResize', scales=[(480, 1333), (400, 4200)]),
    ]
    scale_image_sizes([pipeline], None, target=256)
    f = 256 / 1333
    assert (
        pipeline[0]['scales']
        == [
            (max(32, round(480 * f / 32) * 32), 256),
            (max(32, round(400 * f / 32) * 32), round(4200 * f / 32) * 32),
        ]
        == [(96, 256), (64, 800)]
    )


def test_classify_error_names_the_missing_cpu_kernel():
    from mmcv.ops import diff_iou_rotated_2d

    boxes = torch.tensor([[[10.0, 10.0, 4.0, 2.0, 0.3]]])
    with pytest.raises(RuntimeError) as info:
        diff_iou_rotated_2d(boxes, boxes)
    err = info.value
    message = f'{type(err).__name__}: {err}'
    assert classify_error(message, []) == dict(
        category='cpu_kernel', detail='diff_iou_rotated_sort_vertices'
    )
    assert classify_error(
        "ModuleNotFoundError: No module named 'mmpretrain'", []
    ) == dict(category='missing_dependency', detail='mmpretrain')


def test_static_check_rewrites_an_upstream_config(tmp_path):
    from zoo_static import static_check

    result = static_check(
        'mmrotate::s2anet/s2anet-le90_r50_fpn_1x_dota.py', str(tmp_path)
    )
    assert result['status'] == 'ok', result.get('error')
    assert result['warnings'] == []
    # the guard, the include's two extra hooks (the AMP-only one too: it
    # is built whether the runner would add it or not) and the data check
    # inserted into the one training pipeline
    assert result['built'] == [
        'NanGuardHook',
        'AmpScaleMonitorHook',
        'NanDiagnosisHook',
        'ValidateAnnotations',
    ]
    # S2ANet's modules all have CPU kernels; rotated FCOS's IoU loss not
    assert result['cpu_kernels'] == []
    fcos = static_check(
        'mmrotate::rotated_fcos/rotated-fcos-le90_r50_fpn_1x_dota.py',
        str(tmp_path),
    )
    assert fcos['cpu_kernels'] == ['diff_iou_rotated']
