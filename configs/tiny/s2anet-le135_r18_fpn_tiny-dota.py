# The unmodified mmrotate S2ANet (le135) DOTA config, shrunk to train on the
# CPU: ResNet-18 from scratch (no download), 256 px images from a generated
# DOTA-format folder (see mmnanguard.datagen). A refine detector: its heads
# are bbox_head_init and the list bbox_head_refine, kept as upstream has
# them (256 FPN channels).
_base_ = 'mmrotate::s2anet/s2anet-le135_r50_fpn_1x_dota.py'

data_root = 'data/tiny_dota/'
img_scale = (256, 256)

model = dict(
    backbone=dict(depth=18, init_cfg=None),
    neck=dict(in_channels=[64, 128, 256, 512]),
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
