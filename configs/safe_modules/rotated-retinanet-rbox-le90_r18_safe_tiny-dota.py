# The tiny rotated RetinaNet with the numerically safe modules swapped in:
# StableFocalLoss for mmdet.FocalLoss, SafeDeltaXYWHTRBBoxCoder for
# DeltaXYWHTRBBoxCoder, and SafeRotatedIoULoss on decoded boxes instead of
# L1 on deltas (hence reg_decoded_bbox=True).
_base_ = '../tiny/rotated-retinanet-rbox-le90_r18_tiny-dota.py'

model = dict(
    bbox_head=dict(
        reg_decoded_bbox=True,
        bbox_coder=dict(type='SafeDeltaXYWHTRBBoxCoder'),
        loss_cls=dict(type='StableFocalLoss'),
        loss_bbox=dict(type='SafeRotatedIoULoss'),
    )
)
