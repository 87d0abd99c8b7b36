# Copyright (c) mmnanguard contributors. All rights reserved.
import math

import pytest
import torch
from mmengine.registry import DefaultScope
from mmrotate.models.task_modules.coders import DeltaXYWHTRBBoxCoder
from mmrotate.structures.bbox import RotatedBoxes

import mmnanguard  # noqa: F401  (before mmrotate.models)
from mmnanguard.models.task_modules import SafeDeltaXYWHTRBBoxCoder

pytestmark = pytest.mark.stack_smoke

LO = {'le90': -math.pi / 2, 'le135': -math.pi / 4, 'oc': -math.pi / 2}
PERIOD = {'le90': math.pi, 'le135': math.pi, 'oc': math.pi / 2}

CONFIGS = [
    dict(angle_version='le90', edge_swap=True, proj_xy=True),
    dict(
        angle_version='le90',
        norm_factor=0.5,
        target_means=(0.1, -0.1, 0.0, 0.05, 0.0),
        target_stds=(0.1, 0.1, 0.2, 0.2, 0.1),
    ),
    dict(angle_version='le135', edge_swap=True),
    dict(angle_version='le135', add_ctr_clamp=True, ctr_clamp=16),
    dict(angle_version='oc'),
    dict(angle_version='oc', proj_xy=True),
]


def _boxes(n, version, seed=0):
    g = torch.Generator().manual_seed(seed)
    lo, period = LO[version], PERIOD[version]
    xy = torch.rand(n, 2, generator=g) * 500
    wh = torch.rand(n, 2, generator=g) * 60 + 4
    # stay a margin inside the range, so the upstream 'oc' (which does not
    # wrap angles) is comparable
    t = lo + 0.25 * period + torch.rand(n, 1, generator=g) * 0.5 * period
    return torch.cat([xy, wh, t], dim=1)


# Inputs and expected values of mmrotate's own unit test of
# DeltaXYWHTRBBoxCoder (mmrotate 1.x, tests/test_models/test_task_modules/
# test_coder/test_delta_xywht_rbbox_coder.py).
UP_ROIS = [
    [0.0, 0.0, 1.0, 1.0, 0.0],
    [0.0, 0.0, 1.0, 1.0, 0.1],
    [0.0, 0.0, 1.0, 1.0, 0.1],
    [5.0, 5.0, 5.0, 5.0, 0.3],
]
UP_DELTAS = [
    [0.0, 0.0, 0.0, 0.0, 0.0],
    [1.0, 1.0, 1.0, 1.0, 0.0],
    [0.0, 0.0, 2.0, -1.0, 1.0],
    [0.7, -1.9, -0.5, 0.3, 1.0],
]
UP_DECODED = [
    [0.0000, 0.0000, 1.0000, 1.0000, 0.0000],
    [1.0000, 1.0000, 2.7183, 2.7183, 0.1000],
    [0.0000, 0.0000, 7.3891, 0.3679, 1.1000],
    [8.5000, 0.0000, 3.0327, 6.7493, 1.3000],
]
UP_ENCODED = [
    [0.0000, 0.0000, 0.0000, 0.0000, -1.5708],
    [1.0000, 1.0000, 1.0000, 1.0000, -1.5708],
    [0.0000, 0.0000, -0.9999, 2.0000, -0.5708],
    [0.7000, -1.0000, 0.3000, -0.5000, -0.5708],
]
# the add_ctr_clamp=True, ctr_clamp=2 case of the same test
UP_CLAMP_ROIS = [[0.0, 0.0, 6.0, 6.0, 0.0]] + UP_ROIS[1:]
UP_CLAMP_DELTAS = [[1.0, 1.0, 2.0, 2.0, 0.0]] + UP_DELTAS[1:]
UP_CLAMP_DECODED = [
    [2.0000, 2.0000, 44.3343, 44.3343, 0.0000],
    [1.0000, 1.0000, 2.7183, 2.7183, 0.1000],
    [0.0000, 0.0000, 7.3891, 0.3679, 1.1000],
    [7.0000, 3.0000, 3.0327, 6.7493, 1.3000],
]


def _t(rows):
    return torch.tensor(rows)


def test_upstream_unit_test_values():
    coder = SafeDeltaXYWHTRBBoxCoder()
    rois, deltas = RotatedBoxes(_t(UP_ROIS)), _t(UP_DELTAS)
    for max_shape in [(32, 32), torch.Tensor((32, 32))]:
        out = coder.decode(rois, deltas, max_shape=max_shape).tensor
        torch.testing.assert_close(out, _t(UP_DECODED), rtol=0, atol=1e-4)
    batch = coder.decode(
        RotatedBoxes(_t(UP_ROIS)[None].repeat(2, 1, 1)),
        _t(UP_DELTAS)[None].repeat(2, 1, 1),
        max_shape=(32, 32),
    ).tensor
    torch.testing.assert_close(batch[1], _t(UP_DECODED), rtol=0, atol=1e-4)
    enc = coder.encode(rois, RotatedBoxes(_t(UP_DECODED)))
    torch.testing.assert_close(enc, _t(UP_ENCODED), rtol=0, atol=1e-4)
    clamp = SafeDeltaXYWHTRBBoxCoder(add_ctr_clamp=True, ctr_clamp=2)
    out = clamp.decode(
        RotatedBoxes(_t(UP_CLAMP_ROIS)),
        _t(UP_CLAMP_DELTAS),
        max_shape=(32, 32),
    ).tensor
    torch.testing.assert_close(out, _t(UP_CLAMP_DECODED), rtol=0, atol=1e-4)
    empty = coder.decode(
        RotatedBoxes(torch.zeros(0, 5)), torch.zeros(0, 5), (32, 32)
    )
    assert empty.shape == (0, 5)


def _wild_deltas(n, seed):
    """Deltas that reach every branch: angles far outside any range,
    dw/dh beyond the clip on both sides."""
    g = torch.Generator().manual_seed(seed)
    deltas = torch.randn(n, 5, generator=g) * 2
    deltas[:, 2:4] *= 4  # |dw| up to ~20 > |log(16 / 1000)| = 4.1
    deltas[:, 4] *= 3  # angles up to ~+-20 rad
    return deltas


@pytest.mark.parametrize(
    'cfg',
    CONFIGS
    + [
        dict(angle_version='oc', edge_swap=True),
        dict(angle_version='le90'),
        dict(angle_version='oc', add_ctr_clamp=True, ctr_clamp=8),
    ],
)
def test_decode_equals_upstream_wherever_upstream_is_finite(cfg):
    # no margin kept: unbounded 'oc' angles, le90 without edge_swap,
    # add_ctr_clamp's one-sided dw clamp; the values must be upstream's
    ours, ref = SafeDeltaXYWHTRBBoxCoder(**cfg), DeltaXYWHTRBBoxCoder(**cfg)
    anchors = _boxes(300, cfg['angle_version'], seed=4)
    anchors[:, 4] = (torch.rand(300) - 0.5) * 4
    for deltas in (_wild_deltas(300, 5), _wild_deltas(300, 6).repeat(1, 3)):
        exp = ref.decode(anchors, deltas, max_shape=(400, 450))
        exp = exp.tensor if hasattr(exp, 'tensor') else exp
        assert torch.isfinite(exp).all()
        out = ours.decode(anchors, deltas, max_shape=(400, 450))
        out = out.tensor if hasattr(out, 'tensor') else out
        torch.testing.assert_close(out, exp, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize('version', list(LO))
def test_encode_keeps_tiny_positive_sizes_as_upstream(version):
    # 1e-9 px is positive: upstream's log is finite, and so must be equal
    anchors = _boxes(8, version)
    gts = _boxes(8, version, seed=7)
    gts[:4, 2] = 1e-9
    gts[4:, 3] = 3e-8
    ours = SafeDeltaXYWHTRBBoxCoder(angle_version=version, edge_swap=True)
    ref = DeltaXYWHTRBBoxCoder(angle_version=version, edge_swap=True)
    exp = ref.encode(RotatedBoxes(anchors), RotatedBoxes(gts.clone()))
    assert torch.isfinite(exp).all()
    out = ours.encode(RotatedBoxes(anchors), RotatedBoxes(gts))
    torch.testing.assert_close(out, exp, rtol=1e-6, atol=1e-6)
    # a NaN ground truth is not hidden
    gts[0, 2] = float('nan')
    out = ours.encode(RotatedBoxes(anchors), RotatedBoxes(gts))
    assert torch.isnan(out[0]).any() and torch.isfinite(out[1:]).all()


@pytest.mark.parametrize('cfg', CONFIGS)
def test_encode_decode_match_upstream(cfg):
    version = cfg['angle_version']
    ours, ref = SafeDeltaXYWHTRBBoxCoder(**cfg), DeltaXYWHTRBBoxCoder(**cfg)
    anchors = _boxes(200, version, seed=1)
    gts = _boxes(200, version, seed=2)
    gts[:, :2] = anchors[:, :2] + torch.randn(200, 2) * 5
    if version == 'oc':  # keep the swap-free representation
        gts[:, 4] = anchors[:, 4] + torch.randn(200).clamp(-1, 1) * 0.1
    enc = ours.encode(RotatedBoxes(anchors), RotatedBoxes(gts))
    exp = ref.encode(RotatedBoxes(anchors), RotatedBoxes(gts.clone()))
    torch.testing.assert_close(enc, exp, rtol=1e-5, atol=1e-5)
    deltas = torch.randn(200, 5) * 0.3
    if version == 'oc':
        deltas[:, 4] = deltas[:, 4].clamp(-0.5, 0.5) * 0.2
    dec = ours.decode(RotatedBoxes(anchors), deltas, max_shape=(400, 450))
    exp = ref.decode(RotatedBoxes(anchors), deltas, max_shape=(400, 450))
    torch.testing.assert_close(dec.tensor, exp.tensor, rtol=1e-5, atol=1e-4)
    # batched (B, N, 5) decode and class-wise deltas (N, 5 * k)
    dec2 = ours.decode(anchors[None], deltas[None])
    torch.testing.assert_close(
        dec2.tensor[0],
        ref.decode(anchors, deltas).tensor,
        rtol=1e-5,
        atol=1e-4,
    )
    multi = torch.randn(200, 15) * 0.3
    if version == 'oc':
        multi[:, 4::5] *= 0.05
    torch.testing.assert_close(
        ours.decode(anchors, multi),
        ref.decode(anchors, multi),
        rtol=1e-5,
        atol=1e-4,
    )


@pytest.mark.parametrize('version', list(LO))
@pytest.mark.parametrize('case', ['zero_w', 'zero_h', 'zero_both'])
def test_zero_size_gt_is_finite(version, case):
    coder = SafeDeltaXYWHTRBBoxCoder(angle_version=version, edge_swap=True)
    anchors = _boxes(16, version)
    gts = _boxes(16, version, seed=3)
    if case in ('zero_w', 'zero_both'):
        gts[:, 2] = 0
    if case in ('zero_h', 'zero_both'):
        gts[:, 3] = 0
    deltas = coder.encode(RotatedBoxes(anchors), RotatedBoxes(gts))
    assert torch.isfinite(deltas).all()
    # the clamped edge gives log(eps / anchor edge), by hand
    lo_edge = torch.log(1e-6 / anchors[:, 2:4]).min()
    assert deltas[:, 2:4].min() >= lo_edge - 1e-3
    up = DeltaXYWHTRBBoxCoder(angle_version=version, edge_swap=True)
    assert not torch.isfinite(
        up.encode(RotatedBoxes(anchors), RotatedBoxes(gts))
    ).all()


@pytest.mark.parametrize('version', list(LO))
@pytest.mark.parametrize('value', [1e5, -1e5])
def test_huge_deltas_are_finite_with_gradient(version, value):
    coder = SafeDeltaXYWHTRBBoxCoder(
        angle_version=version, regularize_decode=True
    )
    anchors = _boxes(16, version)
    deltas = torch.full((16, 5), value, requires_grad=True)
    out = coder.decode(anchors, deltas).tensor
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(deltas.grad).all()
    ratio = abs(math.log(16 / 1000))
    w = out[:, 2:4].sort(dim=1).values
    a = anchors[:, 2:4].sort(dim=1).values
    expected = a * math.exp(ratio if value > 0 else -ratio)
    torch.testing.assert_close(w, expected, rtol=1e-5, atol=1e-4)
    lo, period = LO[version], PERIOD[version]
    assert out[:, 4].min() >= lo - 1e-6
    assert out[:, 4].max() <= lo + period + 1e-6


def test_regularize_decode_clamps_dw_both_sides_under_add_ctr_clamp():
    coder = SafeDeltaXYWHTRBBoxCoder(
        angle_version='le90', add_ctr_clamp=True, regularize_decode=True
    )
    anchors = _boxes(4, 'le90')
    deltas = torch.tensor([[0, 0, -50.0, -50.0, 0]]).repeat(4, 1)
    out = coder.decode(anchors, deltas).tensor
    # by default, upstream's one-sided clamp: exp(-50) * w, as upstream
    default = SafeDeltaXYWHTRBBoxCoder(
        angle_version='le90', add_ctr_clamp=True
    )
    up = DeltaXYWHTRBBoxCoder(angle_version='le90', add_ctr_clamp=True)
    torch.testing.assert_close(
        default.decode(anchors, deltas).tensor,
        up.decode(anchors, deltas).tensor,
        rtol=0,
        atol=0,
    )
    ratio = abs(math.log(16 / 1000))
    ws = anchors[:, 2:4].sort(dim=1).values * math.exp(-ratio)
    torch.testing.assert_close(out[:, 2:4].sort(dim=1).values, ws)


@pytest.mark.parametrize('version', list(LO))
def test_angles_on_the_boundary(version):
    lo, period = LO[version], PERIOD[version]
    coder = SafeDeltaXYWHTRBBoxCoder(
        angle_version=version, edge_swap=True, regularize_decode=True
    )
    anchors = _boxes(4, version)
    anchors[:, 4] = torch.tensor([lo, lo + period, lo, lo + period])
    gts = anchors.clone()
    gts[:, 4] = torch.tensor([lo + period, lo, lo, lo + period])
    deltas = coder.encode(RotatedBoxes(anchors), RotatedBoxes(gts))
    assert torch.isfinite(deltas).all()
    out = coder.decode(anchors, deltas.requires_grad_()).tensor
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(deltas.grad).all()
    assert out[:, 4].min() >= lo - 1e-6
    assert out[:, 4].max() <= lo + period + 1e-6
    # same boxes come back (compare corners, representation may differ)
    torch.testing.assert_close(
        _sorted_corners(out.detach()),
        _sorted_corners(gts),
        atol=1e-3,
        rtol=1e-5,
    )


def _sorted_corners(boxes):
    corners = RotatedBoxes(boxes).convert_to('qbox').tensor.view(-1, 4, 2)
    key = corners[..., 0] * 1e4 + corners[..., 1]
    return torch.gather(
        corners, 1, key.argsort(1)[..., None].expand(-1, -1, 2)
    )


def test_oc_regularized_decode_wraps_and_keeps_the_box():
    coder = SafeDeltaXYWHTRBBoxCoder(
        angle_version='oc', regularize_decode=True
    )
    ref = DeltaXYWHTRBBoxCoder(angle_version='oc')
    anchors = _boxes(32, 'oc')
    deltas = torch.randn(32, 5) * 0.3
    deltas[:, 4] = torch.linspace(-2.5, 2.5, 32)
    ours = coder.decode(anchors, deltas).tensor
    up = ref.decode(anchors, deltas).tensor
    assert ours[:, 4].min() >= -math.pi / 2 - 1e-6 and ours[:, 4].max() < 0
    assert up[:, 4].max() > 0  # upstream leaves 'oc' unbounded
    torch.testing.assert_close(
        _sorted_corners(ours), _sorted_corners(up), atol=1e-3, rtol=1e-5
    )


def test_empty_inputs():
    coder = SafeDeltaXYWHTRBBoxCoder(angle_version='le90')
    empty = torch.zeros(0, 5)
    assert coder.encode(RotatedBoxes(empty), RotatedBoxes(empty)).shape == (
        0,
        5,
    )
    assert coder.decode(RotatedBoxes(empty), empty).tensor.shape == (0, 5)


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_low_precision_and_autocast(dtype):
    coder = SafeDeltaXYWHTRBBoxCoder(angle_version='le90')
    anchors = _boxes(64, 'le90')
    deltas = (torch.randn(64, 5) * 3).to(dtype).requires_grad_()
    out = coder.decode(anchors.to(dtype), deltas).tensor
    assert out.dtype == torch.float32
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(deltas.grad).all()
    gts = _boxes(64, 'le90', seed=5)
    gts[:8, 2] = 0
    with torch.autocast('cpu', dtype=torch.bfloat16):
        enc = coder.encode(
            RotatedBoxes(anchors.to(dtype)), RotatedBoxes(gts.to(dtype))
        )
    assert enc.dtype == torch.float32 and torch.isfinite(enc).all()


def test_bad_arguments():
    with pytest.raises(ValueError, match='angle_version'):
        SafeDeltaXYWHTRBBoxCoder(angle_version='le45')
    with pytest.raises(ValueError, match='eps'):
        SafeDeltaXYWHTRBBoxCoder(eps=0)
    coder = SafeDeltaXYWHTRBBoxCoder()
    with pytest.raises(ValueError, match=r'shape \(N, 5\)'):
        coder.encode(torch.zeros(3, 5), torch.zeros(2, 5))
    with pytest.raises(ValueError, match='same length'):
        coder.decode(torch.zeros(3, 5), torch.zeros(2, 5))


def test_build_in_mmrotate_scope():
    from mmrotate.registry import TASK_UTILS

    with DefaultScope.overwrite_default_scope('mmrotate'):
        for name in (
            'SafeDeltaXYWHTRBBoxCoder',
            'mmnanguard.SafeDeltaXYWHTRBBoxCoder',
        ):
            coder = TASK_UTILS.build(
                dict(type=name, angle_version='le90', edge_swap=True)
            )
            assert isinstance(coder, SafeDeltaXYWHTRBBoxCoder)
            assert coder.angle_version == 'le90' and coder.edge_swap
