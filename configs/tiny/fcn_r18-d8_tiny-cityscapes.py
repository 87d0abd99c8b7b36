# The unmodified mmseg FCN ResNet-18 Cityscapes config, shrunk to train on
# the CPU: no pretrained download, BN instead of SyncBN, 128x128 crops from a
# generated 256x128 Cityscapes-format folder (see mmnanguard.datagen).
_base_ = 'mmseg::fcn/fcn_r18-d8_4xb2-80k_cityscapes-512x1024.py'

data_root = 'data/tiny_cityscapes/'
crop_size = (128, 128)
norm_cfg = dict(type='BN', requires_grad=True)

model = dict(
    pretrained=None,
    data_preprocessor=dict(size=crop_size),
    backbone=dict(norm_cfg=norm_cfg, init_cfg=None),
    decode_head=dict(norm_cfg=norm_cfg),
    auxiliary_head=dict(norm_cfg=norm_cfg),
)

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),
    dict(
        type='RandomResize',
        scale=(256, 128),
        ratio_range=(1.0, 1.5),
        keep_ratio=True,
    ),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs'),
]
train_dataloader = dict(
    batch_size=2,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(data_root=data_root, pipeline=train_pipeline),
)

train_cfg = dict(type='IterBasedTrainLoop', max_iters=4, val_interval=10**9)
val_cfg = None
val_dataloader = None
val_evaluator = None
test_cfg = None
test_dataloader = None
test_evaluator = None

default_hooks = dict(
    logger=dict(interval=1),
    checkpoint=dict(interval=4),
    visualization=dict(draw=False),
)
log_processor = dict(window_size=1)
randomness = dict(seed=0)
