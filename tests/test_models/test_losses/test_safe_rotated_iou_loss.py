# Copyright (c) mmnanguard contributors. All rights reserved.
import math

import pytest
import torch
from mmengine.registry import DefaultScope
from shapely.geometry import Polygon

import mmnanguard  # noqa: F401  (before mmrotate.models)
from mmnanguard.models.losses import SafeRotatedIoULoss, diff_rotated_iou
from mmnanguard.models.losses.diff_rotated_iou import box2corners

pytestmark = pytest.mark.stack_smoke


def _shapely_iou(b1, b2):
    """Independent reference: polygon clipping in float64."""
    out = []
    for x, y in zip(b1.double(), b2.double()):
        p1 = Polygon(box2corners(x[None])[0].numpy())
        p2 = Polygon(box2corners(y[None])[0].numpy())
        inter = p1.intersection(p2).area
        union = p1.area + p2.area - inter
        out.append(inter / union if union > 0 else 0.0)
    return torch.tensor(out, dtype=torch.float64)


def _pairs(n=400, seed=0):
    g = torch.Generator().manual_seed(seed)
    b1 = torch.cat(
        [
            torch.rand(n, 2, generator=g) * 200,
            torch.rand(n, 2, generator=g) * 40 + 1,
            (torch.rand(n, 1, generator=g) - 0.5) * math.pi,
        ],
        1,
    )
    b2 = b1 + torch.cat(
        [
            torch.randn(n, 2, generator=g) * 8,
            torch.randn(n, 2, generator=g) * 4,
            torch.randn(n, 1, generator=g) * 0.5,
        ],
        1,
    )
    b2[:, 2:4] = b2[:, 2:4].abs() + 0.5
    b2[:20] = b1[:20]  # identical
    b2[20:40] = b1[20:40][:, [0, 1, 3, 2, 4]]  # w/h swapped + 90 degrees
    b2[20:40, 4] += math.pi / 2
    b2[40:60, 4] = b1[40:60, 4]  # parallel edges
    return b1, b2


def test_iou_matches_shapely():
    b1, b2 = _pairs()
    iou = diff_rotated_iou(b1, b2)
    torch.testing.assert_close(
        iou.double(), _shapely_iou(b1, b2), rtol=0, atol=1e-5
    )
    assert (iou[:40] > 1 - 1e-5).all()


def test_iou_matches_mmcv_box_iou_rotated():
    from mmcv.ops import box_iou_rotated

    b1, b2 = _pairs(seed=1)
    exp = box_iou_rotated(b1, b2, aligned=True)
    torch.testing.assert_close(
        diff_rotated_iou(b1, b2), exp, rtol=0, atol=1e-4
    )


def test_iou_gradient_matches_finite_differences():
    b1, b2 = _pairs(n=60, seed=2)
    b1 = b1[40:].double().requires_grad_()  # generic, non-degenerate
    assert torch.autograd.gradcheck(
        lambda a: diff_rotated_iou(a, b2[40:].double()),
        (b1,),
        eps=1e-7,
        atol=1e-4,
    )


@pytest.mark.parametrize('mode', ['linear', 'square', 'log'])
@pytest.mark.parametrize('reduction', ['none', 'mean', 'sum'])
def test_loss_values(mode, reduction):
    b1, b2 = _pairs(n=100, seed=3)
    iou = _shapely_iou(b1, b2).clamp(min=1e-6, max=1)
    elem = {'linear': 1 - iou, 'square': 1 - iou**2, 'log': -iou.log()}[mode]
    weight = torch.rand(100)
    exp = elem * weight.double()
    exp = {'none': exp, 'mean': exp.mean(), 'sum': exp.sum()}[reduction]
    loss = SafeRotatedIoULoss(mode=mode, reduction=reduction, loss_weight=2.0)
    torch.testing.assert_close(
        loss(b1, b2, weight).double(), 2 * exp, rtol=1e-4, atol=1e-4
    )
    # (N, 5) weights are averaged over the last dimension, as upstream
    torch.testing.assert_close(
        loss(b1, b2, weight[:, None].repeat(1, 5)), loss(b1, b2, weight)
    )
    torch.testing.assert_close(
        loss(b1, b2, avg_factor=10.0, reduction_override='mean'),
        2 * elem.sum().float() / 10,
        rtol=1e-4,
        atol=1e-4,
    )


# Inputs of mmrotate's own RotatedIoULoss test (mmrotate 1.x,
# tests/test_models/test_losses/test_loss.py::TestH2RBoxConsistencyLoss,
# CUDA only there): torch.rand (10, 5) boxes, a (10, ) weight,
# reduction_override='mean', avg_factor=10. Upstream cannot run on the
# CPU; its formula on a float64 shapely IoU is the reference.
@pytest.mark.parametrize('mode', ['linear', 'square', 'log'])
def test_mmrotate_unit_test_inputs(mode):
    g = torch.Generator().manual_seed(5)
    pred = torch.rand((10, 5), generator=g)
    target = torch.rand((10, 5), generator=g)
    weight = torch.rand((10,), generator=g)
    iou = _shapely_iou(pred, target).clamp(min=1e-6)
    elem = {'linear': 1 - iou, 'square': 1 - iou**2, 'log': -iou.log()}[mode]
    loss = SafeRotatedIoULoss(mode=mode)
    cases = [
        (loss(pred, target, weight), (elem * weight.double()).mean()),
        (
            loss(pred, target, weight, reduction_override='mean'),
            (elem * weight.double()).mean(),
        ),
        (
            loss(pred, target, weight, avg_factor=10),
            (elem * weight.double()).sum() / 10,
        ),
        (loss(pred, target), elem.mean()),
    ]
    for out, exp in cases:
        assert out.item() == pytest.approx(exp.item(), rel=1e-4, abs=1e-5)
    with pytest.raises(ValueError):
        loss(pred, target, avg_factor=10, reduction_override='sum')


def test_upstream_rotated_iou_loss_has_no_cpu_kernel():
    """mmcv 2.0.1 sorts the polygon vertices with a CUDA-only op."""
    from mmrotate.models.losses import RotatedIoULoss

    b1, b2 = _pairs(n=4)
    if torch.cuda.is_available():
        pytest.skip('CUDA present: the upstream op runs')
    with pytest.raises(RuntimeError):
        RotatedIoULoss()(b1, b2)


ADVERSARIAL = {
    'identical': ([10, 10, 4, 2, 0.3], [10, 10, 4, 2, 0.3]),
    'zero_w_target': ([10, 10, 4, 2, 0.3], [10, 10, 0, 2, 0.3]),
    'zero_h_target': ([10, 10, 4, 2, 0.3], [10, 10, 4, 0, 0.3]),
    'zero_both': ([10, 10, 0, 0, 0.3], [10, 10, 0, 0, 0.3]),
    'zero_pred': ([10, 10, 0, 0, 0.0], [10, 10, 4, 2, 0.0]),
    'far_apart': ([0, 0, 1, 1, 0], [1e4, 1e4, 1, 1, 0]),
    'boundary_angle': (
        [10, 10, 4, 2, math.pi / 2],
        [10, 10, 4, 2, -math.pi / 2],
    ),
    'huge': ([1e4, 1e4, 1e4, 5e3, 0.1], [1e4, 1e4, 1e4, 5e3, 0.1]),
    'tiny': ([5, 5, 1e-4, 1e-4, 0.2], [5, 5, 1e-4, 1e-4, 0.0]),
    'shared_edge': ([0, 0, 2, 2, 0], [2, 0, 2, 2, 0]),
    'contained': ([0, 0, 4, 4, 0], [0, 0, 2, 2, 0.7]),
    'nearly_parallel': ([0, 0, 4, 2, 1e-7], [0.5, 0.1, 4, 2, 0.0]),
}


@pytest.mark.parametrize('mode', ['linear', 'log'])
@pytest.mark.parametrize('case', list(ADVERSARIAL))
def test_adversarial_boxes_give_finite_loss_and_gradient(case, mode):
    a, b = ADVERSARIAL[case]
    pred = torch.tensor([a], dtype=torch.float32, requires_grad=True)
    target = torch.tensor([b], dtype=torch.float32)
    loss = SafeRotatedIoULoss(mode=mode)(pred, target)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(pred.grad).all()
    ref = _shapely_iou(pred.detach(), target).clamp(1e-6, 1).item()
    iou = (1 - loss.item()) if mode == 'linear' else math.exp(-loss.item())
    if case != 'tiny':  # union below the documented 1e-6 clamp
        assert iou == pytest.approx(ref, abs=1e-4)


# No boxes: 'none' gives one loss per box, i.e. shape (0, ); the sum of
# no terms is 0, and the mean of no boxes is 0 (documented; mmdet's
# weight_reduce_loss would give NaN).
@pytest.mark.parametrize(
    'reduction,shape', [('none', (0,)), ('mean', ()), ('sum', ())]
)
def test_empty_input(reduction, shape):
    pred = torch.zeros(0, 5, requires_grad=True)
    loss = SafeRotatedIoULoss(reduction=reduction)(pred, torch.zeros(0, 5))
    loss.sum().backward()
    assert loss.shape == shape and loss.dtype == torch.float32
    if shape:
        assert loss.numel() == 0
    else:
        assert loss.item() == 0.0
    assert pred.grad is not None and pred.grad.shape == (0, 5)


def test_zero_weight_shortcut_is_finite_for_infinite_pred():
    pred = torch.tensor([[math.inf, 0, 1, 1, 0]], requires_grad=True)
    loss = SafeRotatedIoULoss()(pred, torch.ones(1, 5), torch.zeros(1))
    loss.backward()
    assert loss.item() == 0 and torch.isfinite(pred.grad).all()


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_low_precision_and_autocast(dtype):
    b1, b2 = _pairs(n=64, seed=4)
    b1, b2 = b1 * 10, b2 * 10  # areas beyond the fp16 range
    pred = b1.to(dtype).requires_grad_()
    loss = SafeRotatedIoULoss()(pred, b2.to(dtype))
    loss.backward()
    assert loss.dtype == torch.float32
    assert torch.isfinite(loss) and torch.isfinite(pred.grad).all()
    ref = SafeRotatedIoULoss()(pred.detach().float(), b2.to(dtype).float())
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)
    layer = torch.nn.Linear(5, 5)
    with torch.no_grad():  # identity, so the boxes stay boxes
        layer.weight.copy_(torch.eye(5))
        layer.bias.zero_()
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = layer(b1)
        assert out.dtype == torch.bfloat16
        loss = SafeRotatedIoULoss()(out, b2)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(layer.weight.grad).all()


def test_bad_arguments():
    with pytest.raises(ValueError, match='mode'):
        SafeRotatedIoULoss(mode='cubic')
    with pytest.raises(ValueError, match='eps'):
        SafeRotatedIoULoss(eps=0)
    with pytest.raises(ValueError, match=r'\(N, 5\)'):
        SafeRotatedIoULoss()(torch.zeros(3, 4), torch.zeros(3, 4))
    with pytest.warns(UserWarning, match='deprecated'):
        assert SafeRotatedIoULoss(linear=True).mode == 'linear'


@pytest.mark.parametrize('scope', ['mmrotate', 'mmdet'])
def test_build_from_config_in_scope(scope):
    import importlib

    registry = importlib.import_module(f'{scope}.registry')
    with DefaultScope.overwrite_default_scope(scope):
        for name in ('SafeRotatedIoULoss', 'mmnanguard.SafeRotatedIoULoss'):
            loss = registry.MODELS.build(
                dict(type=name, mode='linear', loss_weight=5.0)
            )
            assert isinstance(loss, SafeRotatedIoULoss)
            assert (loss.mode, loss.loss_weight) == ('linear', 5.0)
