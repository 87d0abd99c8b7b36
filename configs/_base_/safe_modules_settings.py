# The settings of safe_modules.py (explained there) without its `runner_type`
# line: use it instead of safe_modules.py when another base of the config
# sets `runner_type` (see nanguard_settings.py).
_base_ = './nanguard_settings.py'

nanguard = dict(
    module_swaps=[
        dict(replace='FocalLoss', by='StableFocalLoss'),
        dict(replace='mmdet.FocalLoss', by='StableFocalLoss'),
        dict(replace='GDLoss', by='SafeGDLoss'),
        dict(replace='mmrotate.GDLoss', by='SafeGDLoss'),
        dict(replace='RotatedIoULoss', by='SafeRotatedIoULoss'),
        dict(replace='mmrotate.RotatedIoULoss', by='SafeRotatedIoULoss'),
        dict(replace='DeltaXYWHTRBBoxCoder', by='SafeDeltaXYWHTRBBoxCoder'),
        dict(
            replace='mmrotate.DeltaXYWHTRBBoxCoder',
            by='SafeDeltaXYWHTRBBoxCoder',
        ),
        dict(replace='DiceLoss', by='SafeDiceLoss'),
        dict(replace='mmdet.DiceLoss', by='SafeDiceLoss'),
        dict(replace='mmseg.DiceLoss', by='SafeDiceLoss'),
    ]
)
