# Rotated FCOS (mmrotate's RotatedFCOSHead, which takes an ``angle_coder``)
# on the tiny DOTA setup, with SinCosAngleCoder, StableFocalLoss and
# SafeRotatedIoULoss (upstream RotatedIoULoss has no CPU kernel). The angle
# branch predicts (sin 2t, cos 2t), also supervised by an L1 loss.
_base_ = '../tiny/rotated-retinanet-rbox-le90_r18_tiny-dota.py'

angle_version = 'le90'

model = dict(
    type='mmdet.FCOS',
    neck=dict(add_extra_convs='on_output', relu_before_extra_convs=True),
    bbox_head=dict(
        _delete_=True,
        type='RotatedFCOSHead',
        num_classes=15,
        in_channels=64,
        feat_channels=64,
        stacked_convs=2,
        strides=[8, 16, 32, 64, 128],
        center_sampling=True,
        center_sample_radius=1.5,
        norm_on_bbox=True,
        centerness_on_reg=True,
        use_hbbox_loss=False,
        scale_angle=True,
        angle_coder=dict(type='SinCosAngleCoder', angle_version=angle_version),
        bbox_coder=dict(
            type='DistanceAnglePointCoder', angle_version=angle_version
        ),
        loss_cls=dict(
            type='StableFocalLoss',
            use_sigmoid=True,
            gamma=2.0,
            alpha=0.25,
            loss_weight=1.0,
        ),
        loss_bbox=dict(type='SafeRotatedIoULoss', loss_weight=1.0),
        loss_angle=dict(type='mmdet.L1Loss', loss_weight=0.2),
        loss_centerness=dict(
            type='mmdet.CrossEntropyLoss', use_sigmoid=True, loss_weight=1.0
        ),
    ),
    train_cfg=None,
    test_cfg=dict(
        _delete_=True,
        nms_pre=2000,
        min_bbox_size=0,
        score_thr=0.05,
        nms=dict(type='nms_rotated', iou_threshold=0.1),
        max_per_img=2000,
    ),
)
