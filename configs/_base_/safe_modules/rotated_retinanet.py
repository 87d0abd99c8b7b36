# mmnanguard's protection plus the numerically safe modules for rotated
# RetinaNet. Use it INSTEAD of nanguard.py (it includes it):
#   _base_ = [..., 'mmnanguard::_base_/safe_modules/rotated_retinanet.py']
# The runner swaps module types in the model config, keeping every
# argument, so no `model` key is defined here (a second base defining
# `model` would be a duplicate key):
# * StableFocalLoss for mmdet's FocalLoss: log-sigmoid form, finite for any
#   logit, the same value where mmdet's is finite;
# * SafeDeltaXYWHTRBBoxCoder for DeltaXYWHTRBBoxCoder: widths and heights
#   clamped before log (a zero-width target box no longer encodes to
#   log(0) = -inf), dw/dh clamped on both sides when decoding.
# SinCosAngleCoder replaces an `angle_coder` (rotated FCOS, RTMDet, ...);
# rotated RetinaNet's head has none, so it is not swapped here. The safe
# rotated IoU loss needs reg_decoded_bbox=True, not a drop-in for L1: see
# configs/safe_modules/ for full configs that use it.
_base_ = '../nanguard.py'

nanguard = dict(
    module_swaps=[
        dict(replace='mmdet.FocalLoss', by='StableFocalLoss'),
        dict(replace='FocalLoss', by='StableFocalLoss'),
        dict(replace='DeltaXYWHTRBBoxCoder', by='SafeDeltaXYWHTRBBoxCoder'),
    ]
)
