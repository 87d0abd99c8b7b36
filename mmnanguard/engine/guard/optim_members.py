# Copyright (c) mmnanguard contributors. All rights reserved.
"""The optimizer wrappers a runner steps."""

from typing import List

from mmengine.optim import OptimWrapper, OptimWrapperDict


def optim_wrapper_members(optim_wrapper) -> List[OptimWrapper]:
    """The wrappers inside an ``OptimWrapperDict``, or the wrapper itself."""
    if isinstance(optim_wrapper, OptimWrapperDict):
        return list(optim_wrapper.optim_wrappers.values())
    return [optim_wrapper]
