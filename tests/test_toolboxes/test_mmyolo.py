# Copyright (c) mmnanguard contributors. All rights reserved.
"""mmyolo's YOLOv5-s and YOLOv8-s (the ``fast`` configs: ``yolov5_collate``
packs the boxes of a batch into one tensor, ``YOLOv5ParamSchedulerHook``
sets the lr of three param groups, ``ExpMomentumEMA``) through the
include, with a NaN gradient planted at iteration 1."""

import pytest
from stack_marks import needs_mmyolo
from toolbox_runs import check_protected_run, train_protected, upstream_config

from mmnanguard.datagen import COCO_TINY_CLASSES

pytestmark = [pytest.mark.stack_smoke, needs_mmyolo]

CONFIGS = [
    'yolov5/yolov5_s-v61_syncbn_fast_8xb16-300e_coco.py',
    'yolov8/yolov8_s_syncbn_fast_8xb16-500e_coco.py',
]
SIDE = 64


def shrink_pipeline(pipeline):
    """64x64 images; the ``mmdet.Albu`` step (blur/CLAHE with p=0.01) is
    left out: the stack has no albumentations."""
    kept = [t for t in pipeline if t['type'] != 'mmdet.Albu']
    for transform in kept:
        if transform['type'] == 'Mosaic':
            transform['img_scale'] = (SIDE, SIDE)
        if transform['type'] == 'YOLOv5RandomAffine':
            transform['border'] = (
                (-SIDE // 2, -SIDE // 2) if transform.get('border') else (0, 0)
            )
        if transform['type'] in ('YOLOv5KeepRatioResize', 'LetterResize'):
            transform['scale'] = (SIDE, SIDE)
    return kept


def set_num_classes(cfg, num_classes):
    """Every ``num_classes`` of the model config (the head module's and
    YOLOv8's assigner's)."""
    if isinstance(cfg, dict):
        for key, value in cfg.items():
            if key == 'num_classes':
                cfg[key] = num_classes
            else:
                set_num_classes(value, num_classes)
    elif isinstance(cfg, (list, tuple)):
        for value in cfg:
            set_num_classes(value, num_classes)


def shrink_yolo(data_root):
    """Widths / 4, 64x64 images, the generated COCO set's 3 classes, in
    the dataset's pipeline and in a ``PipelineSwitchHook``'s."""

    def shrink(cfg):
        model = cfg.model
        for part in (model.backbone, model.neck, model.bbox_head.head_module):
            part.widen_factor = 0.125
        set_num_classes(model, len(COCO_TINY_CLASSES))
        cfg.train_dataloader.dataset.update(
            data_root=data_root,
            ann_file='annotations/instances.json',
            data_prefix=dict(img='images/'),
            metainfo=dict(classes=COCO_TINY_CLASSES),
            pipeline=shrink_pipeline(cfg.train_dataloader.dataset.pipeline),
        )
        for hook in cfg.get('custom_hooks') or []:
            if hook['type'] == 'mmdet.PipelineSwitchHook':
                hook['switch_pipeline'] = shrink_pipeline(
                    hook['switch_pipeline']
                )

    return shrink


@pytest.mark.parametrize('config', CONFIGS, ids=['yolov5_s', 'yolov8_s'])
def test_yolo_protected(config, tmp_path, tiny_coco_root):
    run = train_protected(
        tmp_path,
        upstream_config('mmyolo', config),
        shrink_yolo(tiny_coco_root),
    )
    report = check_protected_run(run)
    runner = run['runner']
    # the layout this test is about: the batch's boxes in one tensor
    collate = runner.train_dataloader.collate_fn.collate_fn  # a partial
    assert collate.func.__name__ == 'yolov5_collate'
    # three param groups (mmyolo's optimizer constructor), set by its hook
    assert len(runner.optim_wrapper.optimizer.param_groups) == 3
    assert len(report['history'][-1]['lrs']) == 3
