# Copyright (c) mmnanguard contributors. All rights reserved.
"""What each type of the safe include's swap list means in each scope."""

import os.path as osp

import pytest
from mmdet.models.losses import DiceLoss as MMDetDiceLoss
from mmdet.models.losses import FocalLoss as MMDetFocalLoss
from mmengine.config import Config
from mmrotate.models.losses import GDLoss, RotatedIoULoss
from mmrotate.models.task_modules.coders import DeltaXYWHTRBBoxCoder
from mmseg.models.losses import DiceLoss as MMSegDiceLoss
from mmseg.models.losses import FocalLoss as MMSegFocalLoss

import mmnanguard  # noqa: F401  (before mmrotate.models)
from mmnanguard.models import drop_in_for, resolve_type
from mmnanguard.testing.tiny_configs import MIM_ROOT

pytestmark = pytest.mark.stack_smoke

SAFE_INCLUDE = osp.join(MIM_ROOT, 'configs', '_base_', 'safe_modules.py')


def _swaps():
    cfg = Config.fromfile(SAFE_INCLUDE)
    return {s['replace']: s['by'] for s in cfg.nanguard.module_swaps}


@pytest.mark.parametrize(
    'type_name,scope,cls',
    [
        ('FocalLoss', 'mmdet', MMDetFocalLoss),
        # mmrotate's registries are children of mmengine's, not mmdet's:
        # its configs spell mmdet's losses 'mmdet.FocalLoss'
        ('FocalLoss', 'mmrotate', None),
        ('mmdet.FocalLoss', 'mmrotate', MMDetFocalLoss),
        ('FocalLoss', 'mmseg', MMSegFocalLoss),  # another loss
        ('mmdet.FocalLoss', 'mmseg', MMDetFocalLoss),
        ('mmrotate.GDLoss', 'mmdet', GDLoss),
        ('DiceLoss', 'mmdet', MMDetDiceLoss),
        ('DiceLoss', 'mmseg', MMSegDiceLoss),
        ('GDLoss', 'mmrotate', GDLoss),
        ('RotatedIoULoss', 'mmrotate', RotatedIoULoss),
        ('DeltaXYWHTRBBoxCoder', 'mmrotate', DeltaXYWHTRBBoxCoder),
        ('GDLoss', 'mmdet', None),  # not in mmdet's registry tree
    ],
)
def test_resolve_type(type_name, scope, cls):
    assert resolve_type(type_name, scope) is cls


EXPECTED = [
    # type, scope, drop-in (None: kept)
    ('FocalLoss', 'mmdet', 'StableFocalLoss'),
    ('FocalLoss', 'mmseg', None),
    ('mmdet.FocalLoss', 'mmseg', 'StableFocalLoss'),  # MaskFormer in mmseg
    ('mmdet.FocalLoss', 'mmrotate', 'StableFocalLoss'),
    ('GDLoss', 'mmrotate', 'SafeGDLoss'),
    ('mmrotate.GDLoss', 'mmdet', 'SafeGDLoss'),
    ('RotatedIoULoss', 'mmrotate', 'SafeRotatedIoULoss'),
    ('DeltaXYWHTRBBoxCoder', 'mmrotate', 'SafeDeltaXYWHTRBBoxCoder'),
    ('DiceLoss', 'mmdet', 'SafeDiceLoss'),
    ('DiceLoss', 'mmseg', 'SafeDiceLoss'),
    ('mmdet.DiceLoss', 'mmseg', 'SafeDiceLoss'),
    ('CrossEntropyLoss', 'mmdet', None),
    ('StableFocalLoss', 'mmdet', None),  # already safe
]


@pytest.mark.parametrize('type_name,scope,expected', EXPECTED)
def test_drop_in_for_the_safe_include(type_name, scope, expected):
    assert drop_in_for(type_name, _swaps(), scope) == expected


def test_without_a_scope_names_are_compared_as_strings():
    swaps = _swaps()
    assert drop_in_for('FocalLoss', swaps) == 'StableFocalLoss'
    assert drop_in_for('mmseg.FocalLoss', swaps) is None
    # a name that does not resolve in the scope: as a string
    assert drop_in_for('GDLoss', swaps, 'mmdet') == 'SafeGDLoss'


def test_the_include_lists_every_spelling():
    # with string matching (no scope known), every spelling must be a key
    swaps = _swaps()
    for type_name, scope, expected in EXPECTED:
        if expected is not None and scope != 'mmseg':
            assert swaps.get(type_name) == expected, type_name
