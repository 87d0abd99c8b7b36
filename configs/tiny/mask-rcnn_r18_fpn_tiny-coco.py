# The unmodified mmdet Mask R-CNN COCO config, shrunk to train on the CPU:
# ResNet-18 from scratch, 64 FPN channels, 256 px images with instance
# polygons from a generated COCO-format folder with 3 classes (see
# mmnanguard.datagen). Its mask head keeps CrossEntropyLoss(use_mask=True).
_base_ = 'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py'

data_root = 'data/tiny_coco/'
img_scale = (256, 256)
metainfo = dict(classes=('square', 'bar', 'block'))

model = dict(
    backbone=dict(depth=18, init_cfg=None),
    neck=dict(in_channels=[64, 128, 256, 512], out_channels=64),
    rpn_head=dict(in_channels=64, feat_channels=64),
    roi_head=dict(
        bbox_roi_extractor=dict(out_channels=64),
        bbox_head=dict(in_channels=64, fc_out_channels=128, num_classes=3),
        mask_roi_extractor=dict(out_channels=64),
        mask_head=dict(in_channels=64, conv_out_channels=64, num_classes=3),
    ),
    train_cfg=dict(
        rpn_proposal=dict(nms_pre=200, max_per_img=100),
        rcnn=dict(sampler=dict(num=64)),
    ),
)

train_pipeline = [
    dict(type='LoadImageFromFile', backend_args=None),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='Resize', scale=img_scale, keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
train_dataloader = dict(
    batch_size=2,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(
        data_root=data_root,
        metainfo=metainfo,
        ann_file='annotations/instances.json',
        data_prefix=dict(img='images/'),
        pipeline=train_pipeline,
    ),
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
