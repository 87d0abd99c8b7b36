# Copyright (c) mmnanguard contributors. All rights reserved.
import math

import pytest
import torch
from mmengine.registry import DefaultScope

import mmnanguard  # noqa: F401  (before mmrotate.models)
from mmnanguard.models.task_modules import SinCosAngleCoder

pytestmark = pytest.mark.stack_smoke

RANGES = {
    'le90': (-math.pi / 2, math.pi / 2),
    'le135': (-math.pi / 4, 3 * math.pi / 4),
    'oc': (-math.pi / 2, 0.0),
}


def _circular_error(a, b, period):
    d = torch.remainder(a.double() - b.double(), period)
    return torch.minimum(d, period - d)


@pytest.mark.parametrize('version,k', [('le90', 2), ('le135', 2), ('oc', 4)])
def test_encode_values(version, k):
    theta = torch.tensor([[-1.2], [0.0], [0.3], [1.5]])
    enc = SinCosAngleCoder(version).encode(theta)
    assert SinCosAngleCoder.encode_size == 2 and enc.shape == (4, 2)
    torch.testing.assert_close(enc[:, 0], torch.sin(k * theta[:, 0]))
    torch.testing.assert_close(enc[:, 1], torch.cos(k * theta[:, 0]))


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
@pytest.mark.parametrize('version', list(RANGES))
def test_round_trip_full_range_with_boundaries(version, dtype):
    lo, hi = RANGES[version]
    period = hi - lo
    theta = torch.linspace(lo, hi, 100001, dtype=dtype)
    coder = SinCosAngleCoder(version)
    out = coder.decode(coder.encode(theta[:, None]))
    assert out.shape == theta.shape and out.dtype == dtype
    # the two ends of the range are the same box: compare modulo the period
    assert _circular_error(out, theta, period).max() < 1e-6
    # output stays in [lo, hi)
    assert out.min() >= lo - 1e-7 and out.max() < hi + 1e-7
    # interior points come back as themselves
    inner = (theta > lo + 1e-5) & (theta < hi - 1e-5)
    assert (out[inner].double() - theta[inner].double()).abs().max() < 1e-6
    # the lower boundary itself, exactly
    lower = coder.decode(coder.encode(theta.new_tensor([[lo + 1e-6]])))
    assert abs(lower.item() - (lo + 1e-6)) < 1e-6


@pytest.mark.parametrize('keepdim', [True, False])
def test_round_trip_equals_upstream_angle_coders(keepdim):
    """In a head's ``angle_coder`` slot, what matters is the decoded angle:
    on the le90 range it equals mmrotate's PseudoAngleCoder (the default
    of RotatedFCOSHead / RotatedRTMDetHead) exactly and its PSCCoder to
    its precision, with the same shapes."""
    from mmrotate.models.task_modules.coders import (
        PSCCoder,
        PseudoAngleCoder,
    )

    theta = torch.linspace(-math.pi / 2 + 1e-3, math.pi / 2 - 1e-3, 2001)
    theta = theta[:, None]
    ours = SinCosAngleCoder('le90')
    out = ours.decode(ours.encode(theta), keepdim=keepdim)
    pseudo = PseudoAngleCoder()
    exp = pseudo.decode(pseudo.encode(theta), keepdim=keepdim)
    assert out.shape == exp.shape
    torch.testing.assert_close(out, exp, rtol=0, atol=2e-6)
    psc = PSCCoder('le90')
    exp = psc.decode(psc.encode(theta), keepdim=keepdim)
    assert out.shape == exp.shape
    torch.testing.assert_close(out, exp, rtol=0, atol=1e-4)


def test_no_jump_at_le90_boundary():
    coder = SinCosAngleCoder('le90')
    eps = 1e-4
    below = coder.encode(torch.tensor([[math.pi / 2 - eps]]))
    above = coder.encode(torch.tensor([[-math.pi / 2 + eps]]))
    # angles 2 * eps apart (mod pi) encode 2 * k * eps = 4e-4 apart
    assert (below - above).norm() == pytest.approx(4 * eps, rel=1e-2)
    # dense sweep across +-pi/2: every step moves the code by k * step
    theta = torch.linspace(
        -3 * math.pi / 4, 3 * math.pi / 4, 20001, dtype=torch.float64
    )[:, None]
    enc = coder.encode(theta)
    step = (theta[1] - theta[0]).item()
    assert (enc[1:] - enc[:-1]).norm(dim=1).max() < 2 * step * 1.001


@pytest.mark.parametrize('keepdim', [True, False])
def test_decode_shapes_and_empty(keepdim):
    coder = SinCosAngleCoder('le90')
    preds = torch.randn(3, 7, 2)
    out = coder.decode(preds, keepdim=keepdim)
    assert out.shape == ((3, 7, 1) if keepdim else (3, 7))
    # scale does not matter, only the direction
    torch.testing.assert_close(coder.decode(preds * 5.0, keepdim), out)
    empty = coder.decode(torch.zeros(0, 2), keepdim=keepdim)
    assert empty.shape == ((0, 1) if keepdim else (0,))
    assert coder.encode(torch.zeros(0, 1)).shape == (0, 2)


def test_zero_pair_and_gradient_finite():
    coder = SinCosAngleCoder('le90')
    preds = torch.tensor(
        [[0.0, 0.0], [0.0, -1.0], [1e-30, 1e-30], [6e4, -6e4]],
        requires_grad=True,
    )
    out = coder.decode(preds)
    out.sum().backward()
    assert out[0].item() == 0.0
    assert abs(abs(out[1].item()) - math.pi / 2) < 1e-6
    assert torch.isfinite(out).all() and torch.isfinite(preds.grad).all()
    assert preds.grad[0].abs().sum() == 0


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_low_precision(dtype):
    coder = SinCosAngleCoder('le90')
    theta = torch.linspace(-math.pi / 2, math.pi / 2, 101)[:, None]
    enc = coder.encode(theta.to(dtype)).requires_grad_()
    out = coder.decode(enc)
    out.float().sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(enc.grad).all()
    err = _circular_error(out.float(), theta[:, 0].to(dtype).float(), math.pi)
    assert err.max() < 2e-2


def test_bad_arguments():
    with pytest.raises(ValueError, match='angle_version'):
        SinCosAngleCoder('le45')
    with pytest.raises(ValueError, match=r'\(\.\.\., 1\)'):
        SinCosAngleCoder().encode(torch.zeros(3, 2))
    with pytest.raises(ValueError, match=r'\(\.\.\., 2\)'):
        SinCosAngleCoder().decode(torch.zeros(3, 3))


def test_build_in_mmrotate_scope():
    from mmrotate.registry import TASK_UTILS

    with DefaultScope.overwrite_default_scope('mmrotate'):
        for name in ('SinCosAngleCoder', 'mmnanguard.SinCosAngleCoder'):
            coder = TASK_UTILS.build(dict(type=name, angle_version='oc'))
            assert isinstance(coder, SinCosAngleCoder) and coder.k == 4


HEADS = {
    'RotatedFCOSHead': dict(
        type='RotatedFCOSHead',
        num_classes=3,
        in_channels=32,
        feat_channels=32,
        stacked_convs=1,
    ),
    'AngleBranchRetinaHead': dict(
        type='AngleBranchRetinaHead',
        num_classes=3,
        in_channels=32,
        feat_channels=32,
        stacked_convs=1,
        anchor_generator=dict(
            type='FakeRotatedAnchorGenerator',
            angle_version='le90',
            octave_base_scale=4,
            scales_per_octave=3,
            ratios=[1.0, 0.5, 2.0],
            strides=[8, 16, 32, 64, 128],
        ),
        bbox_coder=dict(
            type='DeltaXYWHTRBBoxCoder',
            angle_version='le90',
            norm_factor=None,
            edge_swap=True,
            proj_xy=True,
            target_means=(0.0, 0.0, 0.0, 0.0, 0.0),
            target_stds=(1.0, 1.0, 1.0, 1.0, 1.0),
        ),
        loss_cls=dict(type='StableFocalLoss'),
        loss_bbox=dict(type='mmdet.L1Loss'),
        loss_angle=dict(type='mmdet.L1Loss', loss_weight=0.2),
    ),
    'RotatedRTMDetHead': dict(
        type='RotatedRTMDetHead',
        num_classes=3,
        in_channels=32,
        feat_channels=32,
        stacked_convs=1,
        anchor_generator=dict(
            type='mmdet.MlvlPointGenerator', offset=0, strides=[8, 16, 32]
        ),
        bbox_coder=dict(type='DistanceAnglePointCoder', angle_version='le90'),
        loss_cls=dict(
            type='mmdet.QualityFocalLoss',
            use_sigmoid=True,
            beta=2.0,
            loss_weight=1.0,
        ),
        loss_bbox=dict(type='RotatedIoULoss', mode='linear', loss_weight=2.0),
    ),
}


@pytest.mark.parametrize('head', list(HEADS))
def test_plugs_into_heads_with_angle_coder(head):
    """The mmrotate 1.0.0rc1 heads that build an ``angle_coder`` size
    their angle branch by its ``encode_size`` (2 channels here)."""
    from mmrotate.registry import MODELS

    cfg = dict(
        HEADS[head],
        angle_coder=dict(type='SinCosAngleCoder', angle_version='le90'),
    )
    with DefaultScope.overwrite_default_scope('mmrotate'):
        module = MODELS.build(cfg)
    assert isinstance(module.angle_coder, SinCosAngleCoder)
    angle_convs = [
        m
        for n, m in module.named_modules()
        if 'ang' in n and isinstance(m, torch.nn.Conv2d)
    ]
    assert angle_convs
    num_anchors = getattr(module, 'num_base_priors', 1)
    assert angle_convs[-1].out_channels == 2 * num_anchors
