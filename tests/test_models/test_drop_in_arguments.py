# Copyright (c) mmnanguard contributors. All rights reserved.
"""Every constructor argument of each upstream module that the safe
include replaces is accepted by its drop-in, with the same default and
the same meaning: for each argument in turn, both are built with a
non-default value and must return the same thing."""

import inspect
import warnings

import pytest
import torch
from mmdet.models.losses import DiceLoss as MMDetDiceLoss
from mmdet.models.losses import FocalLoss
from mmrotate.models.losses import GDLoss, RotatedIoULoss
from mmrotate.models.task_modules.coders import DeltaXYWHTRBBoxCoder
from mmrotate.structures.bbox import RotatedBoxes
from mmseg.models.losses import DiceLoss as MMSegDiceLoss

import mmnanguard  # noqa: F401  (before mmrotate.models)
from mmnanguard.models.losses import (
    SafeDiceLoss,
    SafeGDLoss,
    SafeRotatedIoULoss,
    StableFocalLoss,
)
from mmnanguard.models.task_modules import SafeDeltaXYWHTRBBoxCoder

pytestmark = pytest.mark.stack_smoke


def _g(seed=0):
    return torch.Generator().manual_seed(seed)


def _focal_inputs():
    # values in (0, 1): valid logits and, for activated=True, probabilities
    g = _g()
    return torch.rand(16, 5, generator=g), torch.randint(
        0, 6, (16,), generator=g
    )


def _rboxes(n=16, seed=0):
    g = _g(seed)
    return torch.cat(
        [
            torch.rand(n, 2, generator=g) * 50,
            torch.rand(n, 2, generator=g) * 20 + 2,
            torch.rand(n, 1, generator=g) - 0.5,  # also a valid pearson
        ],
        1,
    )


def _gd_inputs():
    pred = _rboxes()
    target = pred + torch.randn(16, 5, generator=_g(1)) * 0.2
    return pred, target


def _mmdet_dice_inputs():
    g = _g()
    pred = torch.randn(4, 64, generator=g)
    return pred, (torch.rand(4, 64, generator=g) > 0.5).float()


def _mmseg_dice_inputs():
    g = _g()
    pred = torch.randn(2, 3, 8, 8, generator=g)
    return pred, torch.randint(0, 3, (2, 8, 8), generator=g)


def _decode(coder):
    anchors = _rboxes(seed=2)
    deltas = torch.randn(16, 5, generator=_g(3)) * 3
    out = coder.decode(anchors, deltas, max_shape=(40, 60))
    enc = coder.encode(RotatedBoxes(anchors), RotatedBoxes(_rboxes(seed=4)))
    return getattr(out, 'tensor', out), enc


#: upstream class, drop-in, base kwargs, non-default values, how to run
PAIRS = {
    'FocalLoss': (
        FocalLoss,
        StableFocalLoss,
        {},
        dict(
            use_sigmoid=True,
            gamma=1.5,
            alpha=0.4,
            reduction='sum',
            loss_weight=2.0,
            activated=True,
        ),
        lambda loss: loss(*_focal_inputs()),
    ),
    'GDLoss': (
        GDLoss,
        SafeGDLoss,
        dict(loss_type='kld'),
        dict(
            loss_type='jd',
            representation='xy_stddev_pearson',
            fun='sqrt',
            tau=1.0,
            alpha=2.0,
            reduction='sum',
            loss_weight=2.0,
        ),
        lambda loss: loss(*_gd_inputs()),
    ),
    'RotatedIoULoss': (
        RotatedIoULoss,
        SafeRotatedIoULoss,
        {},
        dict(
            linear=True,
            eps=1e-3,
            reduction='sum',
            loss_weight=2.0,
            mode='square',
        ),
        # upstream has a CUDA kernel only: compare what it stores
        lambda loss: (
            loss.mode,
            loss.linear,
            loss.eps,
            loss.reduction,
            loss.loss_weight,
        ),
    ),
    'DeltaXYWHTRBBoxCoder': (
        DeltaXYWHTRBBoxCoder,
        SafeDeltaXYWHTRBBoxCoder,
        {},
        dict(
            target_means=(0.1, -0.1, 0.0, 0.05, 0.0),
            target_stds=(0.1, 0.1, 0.2, 0.2, 0.1),
            angle_version='le90',
            norm_factor=0.5,
            edge_swap=True,
            proj_xy=True,
            add_ctr_clamp=True,
            ctr_clamp=4,
            use_box_type=False,
        ),
        _decode,
    ),
    'mmdet.DiceLoss': (
        MMDetDiceLoss,
        SafeDiceLoss,
        {},
        dict(
            use_sigmoid=True,
            activate=False,
            reduction='sum',
            naive_dice=True,
            loss_weight=2.0,
            eps=0.5,
        ),
        lambda loss: loss(*_mmdet_dice_inputs()),
    ),
    'mmseg.DiceLoss': (
        MMSegDiceLoss,
        SafeDiceLoss,
        {},
        dict(
            use_sigmoid=False,
            activate=False,
            reduction='sum',
            naive_dice=True,
            loss_weight=2.0,
            ignore_index=1,
            eps=0.5,
            loss_name='loss_other',
        ),
        lambda loss: (loss(*_mmseg_dice_inputs()), loss.loss_name),
    ),
}


def _params(fn):
    return {
        name: p
        for name, p in inspect.signature(fn).parameters.items()
        if name != 'self'
    }


@pytest.mark.parametrize('name', list(PAIRS))
def test_every_upstream_argument_is_accepted_with_its_default(name):
    upstream, safe, _, values, _ = PAIRS[name]
    up, ours = _params(upstream.__init__), _params(safe.__init__)
    named = {k: p for k, p in up.items() if p.kind != p.VAR_KEYWORD}
    assert set(named) <= set(ours), set(named) - set(ours)
    for key, param in named.items():
        assert ours[key].default == param.default, key
    # the test below varies every one of them
    assert set(values) == set(named)
    if any(p.kind == p.VAR_KEYWORD for p in up.values()):
        # GDLoss passes its **kwargs to the loss function: so does ours
        assert any(p.kind == p.VAR_KEYWORD for p in ours.values())
    # forward / decode: every named upstream argument exists by name
    method = 'decode' if name == 'DeltaXYWHTRBBoxCoder' else 'forward'
    up_call = _params(getattr(upstream, method))
    our_call = _params(getattr(safe, method))
    missing = {
        k
        for k, p in up_call.items()
        if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    } - set(our_call)
    assert not missing, missing
    if name == 'GDLoss':  # per-call loss options, as upstream
        assert our_call['kwargs'].kind == inspect.Parameter.VAR_KEYWORD


def _same(a, b):
    if isinstance(a, tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    elif isinstance(a, torch.Tensor):
        torch.testing.assert_close(b.to(a.dtype), a, rtol=1e-5, atol=1e-6)
    else:
        assert a == b


def _differs(a, b):
    if isinstance(a, tuple):
        return any(_differs(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return a.shape != b.shape or not torch.allclose(a, b)
    return a != b


#: arguments whose only effect is the type of the result, or whose only
#: value that upstream accepts is the default (mmdet raises
#: NotImplementedError for use_sigmoid=False)
NO_VALUE_EFFECT = {
    ('FocalLoss', 'use_sigmoid'),
    ('mmdet.DiceLoss', 'use_sigmoid'),
    ('DeltaXYWHTRBBoxCoder', 'use_box_type'),
}


#: arguments that act only together with another one
NEEDS = {('DeltaXYWHTRBBoxCoder', 'ctr_clamp'): dict(add_ctr_clamp=True)}


@pytest.mark.parametrize(
    'name,key',
    [(name, key) for name, pair in PAIRS.items() for key in pair[3]],
)
def test_each_argument_has_the_upstream_meaning(name, key):
    upstream, safe, base, values, run = PAIRS[name]
    base = dict(base, **NEEDS.get((name, key), {}))
    kwargs = dict(base, **{key: values[key]})
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # linear=True is deprecated
        expected = run(upstream(**kwargs))
        got = run(safe(**kwargs))
        default = run(upstream(**base))
    _same(expected, got)
    # the chosen value changes the result: the comparison is not vacuous
    if (name, key) not in NO_VALUE_EFFECT:
        assert _differs(expected, default), key


def test_rotated_iou_linear_flag_means_linear_mode():
    for cls in (RotatedIoULoss, SafeRotatedIoULoss):
        with pytest.warns(UserWarning, match='deprecated'):
            assert cls(linear=True).mode == 'linear'
