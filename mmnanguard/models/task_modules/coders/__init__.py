# Copyright (c) mmnanguard contributors. All rights reserved.
"""Box and angle coders for rotated boxes: registered when mmrotate
imports, placeholders with a clear error otherwise
(:mod:`mmnanguard.optional`)."""

from mmnanguard.optional import (
    is_available,
    missing_attribute,
    register_unavailable,
)
from mmnanguard.registry import TASK_UTILS

#: The coders of this package; all of them need mmrotate.
ROTATED = ['SafeDeltaXYWHTRBBoxCoder', 'SinCosAngleCoder']

if is_available('mmrotate'):
    from .safe_delta_xywht_rbbox_coder import (
        SafeDeltaXYWHTRBBoxCoder,  # noqa: F401
    )
    from .sincos_angle_coder import SinCosAngleCoder  # noqa: F401

    __all__ = list(ROTATED)
else:
    register_unavailable(TASK_UTILS, ROTATED, 'mmrotate')
    __getattr__ = missing_attribute(__name__, ROTATED, 'mmrotate')
    __all__ = []
