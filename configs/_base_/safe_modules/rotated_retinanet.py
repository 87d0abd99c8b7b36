# mmnanguard's protection plus the numerically safe modules, for rotated
# RetinaNet. Use it INSTEAD of nanguard.py (it includes it):
#   _base_ = [..., 'mmnanguard::_base_/safe_modules/rotated_retinanet.py']
# It is the general include ../safe_modules.py, which swaps, in rotated
# RetinaNet, mmdet's FocalLoss for StableFocalLoss and the
# DeltaXYWHTRBBoxCoder for SafeDeltaXYWHTRBBoxCoder (every argument kept;
# see that file for the whole list). SinCosAngleCoder replaces an
# `angle_coder` (rotated FCOS, RTMDet, ...); rotated RetinaNet's head has
# none, so it is not swapped here. The safe rotated IoU loss needs
# reg_decoded_bbox=True, not a drop-in for L1: see configs/safe_modules/
# for full configs that use it.
_base_ = '../safe_modules.py'
