# Copyright (c) mmnanguard contributors. All rights reserved.
from .safe_delta_xywht_rbbox_coder import SafeDeltaXYWHTRBBoxCoder
from .sincos_angle_coder import SinCosAngleCoder

__all__ = ['SafeDeltaXYWHTRBBoxCoder', 'SinCosAngleCoder']
