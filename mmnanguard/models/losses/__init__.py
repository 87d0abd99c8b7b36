# Copyright (c) mmnanguard contributors. All rights reserved.
"""Numerically safe losses. The rotated-box losses register when mmrotate
imports, placeholders with a clear error otherwise
(:mod:`mmnanguard.optional`)."""

from mmnanguard.optional import (
    is_available,
    missing_attribute,
    register_unavailable,
)
from mmnanguard.registry import MODELS

from .checked_cross_entropy_loss import (
    CheckedCrossEntropyLoss,
    InvalidLabelError,
    check_cross_entropy_labels,
)
from .diff_rotated_iou import diff_rotated_iou
from .safe_dice_loss import SafeDiceLoss, safe_dice_loss
from .stable_focal_loss import StableFocalLoss, stable_sigmoid_focal_loss

#: Registered losses that need mmrotate.
ROTATED = ['SafeRotatedIoULoss', 'SafeGDLoss']

__all__ = [
    'StableFocalLoss',
    'stable_sigmoid_focal_loss',
    'diff_rotated_iou',
    'SafeDiceLoss',
    'safe_dice_loss',
    'CheckedCrossEntropyLoss',
    'check_cross_entropy_labels',
    'InvalidLabelError',
]

if is_available('mmrotate'):
    from .safe_gaussian_dist_loss import SafeGDLoss  # noqa: F401
    from .safe_rotated_iou_loss import (  # noqa: F401
        SafeRotatedIoULoss,
        safe_rotated_iou_loss,
    )

    __all__ += ROTATED + ['safe_rotated_iou_loss']
else:
    register_unavailable(MODELS, ROTATED, 'mmrotate')
    __getattr__ = missing_attribute(
        __name__, ROTATED + ['safe_rotated_iou_loss'], 'mmrotate'
    )
