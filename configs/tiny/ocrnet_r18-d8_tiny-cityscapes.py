# The unmodified mmseg OCRNet (ResNet-101-D8) Cityscapes config, shrunk to
# train on the CPU: ResNet-18-D8 from scratch, BN instead of SyncBN, 128x128
# crops from a generated 256x128 Cityscapes-format folder (see
# mmnanguard.datagen). Its decode_head is a list (FCNHead, OCRHead); the
# heads' in_channels follow ResNet-18's stages (256, 512).
_base_ = 'mmseg::ocrnet/ocrnet_r101-d8_4xb2-40k_cityscapes-512x1024.py'

data_root = 'data/tiny_cityscapes/'
crop_size = (128, 128)
norm_cfg = dict(type='BN', requires_grad=True)

model = dict(
    pretrained=None,
    data_preprocessor=dict(size=crop_size),
    backbone=dict(depth=18, norm_cfg=norm_cfg, init_cfg=None),
    decode_head=[
        dict(
            type='FCNHead',
            in_channels=256,
            in_index=2,
            channels=64,
            num_convs=1,
            concat_input=False,
            dropout_ratio=0.1,
            num_classes=19,
            norm_cfg=norm_cfg,
            align_corners=False,
            loss_decode=dict(
                type='CrossEntropyLoss', use_sigmoid=False, loss_weight=0.4
            ),
        ),
        dict(
            type='OCRHead',
            in_channels=512,
            in_index=3,
            channels=128,
            ocr_channels=64,
            dropout_ratio=0.1,
            num_classes=19,
            norm_cfg=norm_cfg,
            align_corners=False,
            loss_decode=dict(
                type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0
            ),
        ),
    ],
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
