# The unmodified mmrotate rotated RTMDet-tiny DOTA config (it has
# custom_hooks with an EMAHook), shrunk to train on the CPU: no pretrained
# download, BN instead of SyncBN, 256 px images from a generated DOTA-format
# folder (see mmnanguard.datagen). mmcv 2.0.1's diff_iou_rotated, behind
# mmrotate's RotatedIoULoss, has no CPU kernel: the pure-torch
# SafeRotatedIoULoss (mmnanguard, same IoU and mode) stands in for it.
_base_ = 'mmrotate::rotated_rtmdet/rotated_rtmdet_tiny-3x-dota.py'

data_root = 'data/tiny_dota/'
img_scale = (256, 256)
norm_cfg = dict(type='BN')

model = dict(
    backbone=dict(init_cfg=None, norm_cfg=norm_cfg),
    neck=dict(norm_cfg=norm_cfg),
    bbox_head=dict(
        norm_cfg=norm_cfg,
        loss_bbox=dict(
            type='SafeRotatedIoULoss', mode='linear', loss_weight=2.0
        ),
    ),
)

train_pipeline = [
    dict(type='mmdet.LoadImageFromFile', backend_args=None),
    dict(type='mmdet.LoadAnnotations', with_bbox=True, box_type='qbox'),
    dict(type='ConvertBoxType', box_type_mapping=dict(gt_bboxes='rbox')),
    dict(type='mmdet.Resize', scale=img_scale, keep_ratio=True),
    dict(
        type='mmdet.RandomFlip',
        prob=0.75,
        direction=['horizontal', 'vertical', 'diagonal'],
    ),
    dict(type='mmdet.Pad', size=img_scale, pad_val=dict(img=(114, 114, 114))),
    dict(type='mmdet.PackDetInputs'),
]
train_dataloader = dict(
    batch_size=2,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(data_root=data_root, pipeline=train_pipeline),
)

train_cfg = dict(max_epochs=2, val_interval=100)
val_cfg = None
val_dataloader = None
val_evaluator = None
test_cfg = None
test_dataloader = None
test_evaluator = None

default_hooks = dict(logger=dict(interval=1), visualization=dict(draw=False))
log_processor = dict(window_size=1)
randomness = dict(seed=0)
