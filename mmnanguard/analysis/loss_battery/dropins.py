# Copyright (c) mmnanguard contributors. All rights reserved.
"""mmnanguard's numerically safe drop-in for an upstream module class."""

from typing import Optional, Tuple

#: (top-level package, class name) -> the drop-in's type name. Every
#: upstream argument is accepted by the drop-in (swap ``type=`` only).
SAFE_DROP_INS = {
    ('mmdet', 'FocalLoss'): 'StableFocalLoss',
    ('mmrotate', 'GDLoss'): 'SafeGDLoss',
    ('mmrotate', 'RotatedIoULoss'): 'SafeRotatedIoULoss',
    ('mmdet', 'DiceLoss'): 'SafeDiceLoss',
    ('mmseg', 'DiceLoss'): 'SafeDiceLoss',
    ('mmrotate', 'DeltaXYWHTRBBoxCoder'): 'SafeDeltaXYWHTRBBoxCoder',
    ('mmdet', 'CrossEntropyLoss'): 'CheckedCrossEntropyLoss',
    ('mmseg', 'CrossEntropyLoss'): 'CheckedCrossEntropyLoss',
}
#: Drop-ins that ``NanGuardRunner`` already swaps in by itself.
SWAPPED_BY_RUNNER = ('CheckedCrossEntropyLoss',)
#: The include that swaps every module of :data:`SAFE_DROP_INS`.
SAFE_MODULES_INCLUDE = 'mmnanguard::_base_/safe_modules.py'


def class_key(cls: type) -> Tuple[str, str]:
    """``(top-level package, class name)`` of ``cls``."""
    return cls.__module__.split('.')[0], cls.__name__


def drop_in_for(cls: type) -> Optional[str]:
    """The drop-in type name for ``cls``, or None if there is none."""
    return SAFE_DROP_INS.get(class_key(cls))


def drop_in_config(cfg: dict, cls: type) -> Optional[dict]:
    """``cfg`` with its type swapped for the drop-in of ``cls``.

    Args:
        cfg (dict): The upstream module's config.
        cls (type): The class its type resolves to.

    Returns:
        dict, optional: The drop-in's config (every other argument kept),
        or None if ``cls`` has no drop-in.
    """
    name = drop_in_for(cls)
    if name is None:
        return None
    out = dict(cfg, type=f'mmnanguard.{name}')
    if name == 'CheckedCrossEntropyLoss':
        out.setdefault('impl', class_key(cls)[0])
    return out
