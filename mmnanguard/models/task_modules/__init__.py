# Copyright (c) mmnanguard contributors. All rights reserved.
from .coders import SafeDeltaXYWHTRBBoxCoder, SinCosAngleCoder

__all__ = ['SafeDeltaXYWHTRBBoxCoder', 'SinCosAngleCoder']
