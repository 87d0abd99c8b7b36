# Copyright (c) mmnanguard contributors. All rights reserved.
from .checked_cross_entropy_loss import (
    CheckedCrossEntropyLoss,
    InvalidLabelError,
    check_cross_entropy_labels,
)
from .diff_rotated_iou import diff_rotated_iou
from .safe_dice_loss import SafeDiceLoss, safe_dice_loss
from .safe_gaussian_dist_loss import SafeGDLoss
from .safe_rotated_iou_loss import SafeRotatedIoULoss, safe_rotated_iou_loss
from .stable_focal_loss import StableFocalLoss, stable_sigmoid_focal_loss

__all__ = [
    'StableFocalLoss',
    'stable_sigmoid_focal_loss',
    'SafeRotatedIoULoss',
    'safe_rotated_iou_loss',
    'diff_rotated_iou',
    'SafeGDLoss',
    'SafeDiceLoss',
    'safe_dice_loss',
    'CheckedCrossEntropyLoss',
    'check_cross_entropy_labels',
    'InvalidLabelError',
]
