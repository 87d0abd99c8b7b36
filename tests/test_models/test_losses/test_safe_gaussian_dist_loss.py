# Copyright (c) mmnanguard contributors. All rights reserved.
import math

import pytest
import torch
from mmengine.registry import DefaultScope
from mmrotate.models.losses import GDLoss

import mmnanguard  # noqa: F401  (before mmrotate.models)
from mmnanguard.analysis.loss_battery import battery_cases
from mmnanguard.models.losses import SafeGDLoss
from mmnanguard.testing import assert_loss_stable

pytestmark = pytest.mark.stack_smoke

LOSS_TYPES = ['kld', 'jd', 'kld_symmax', 'kld_symmin', 'gwd']


def _boxes(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    pred = torch.cat(
        [
            torch.rand(n, 2, generator=g) * 100,
            torch.rand(n, 2, generator=g) * 40 + 5,
            (torch.rand(n, 1, generator=g) - 0.5) * math.pi,
        ],
        1,
    )
    target = pred.clone()
    target[:, :2] += torch.randn(n, 2, generator=g) * 3
    target[:, 2:4] *= torch.rand(n, 2, generator=g) + 0.5
    target[:, 4] += torch.randn(n, generator=g) * 0.3
    return pred, target


def _loss_and_grad(loss, pred, target):
    x = pred.clone().requires_grad_()
    out = loss(x, target)
    out.backward()
    return out.detach(), x.grad


@pytest.mark.parametrize(
    'fun,tau', [('log1p', 1.0), ('none', 0.0), ('sqrt', 2.0)]
)
@pytest.mark.parametrize('loss_type', LOSS_TYPES)
def test_matches_upstream_on_normal_boxes(loss_type, fun, tau):
    pred, target = _boxes()
    cfg = dict(loss_type=loss_type, fun=fun, tau=tau, loss_weight=2.0)
    out, grad = _loss_and_grad(SafeGDLoss(**cfg), pred, target)
    exp, exp_grad = _loss_and_grad(GDLoss(**cfg), pred, target)
    torch.testing.assert_close(out, exp, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad, exp_grad, rtol=1e-4, atol=1e-6)


def test_matches_upstream_options_and_pearson_representation():
    pred, target = _boxes(seed=1)
    weight = torch.rand(pred.size(0))
    for kwargs in (dict(sqrt=False), dict(alpha=2.0)):
        torch.testing.assert_close(
            SafeGDLoss('kld', **kwargs)(pred, target, weight, avg_factor=10.0),
            GDLoss('kld', **kwargs)(pred, target, weight, avg_factor=10.0),
        )
    torch.testing.assert_close(
        SafeGDLoss('gwd', normalize=False)(pred, target),
        GDLoss('gwd', normalize=False)(pred, target),
    )
    g = torch.Generator().manual_seed(2)
    p = torch.cat([pred[:, :4], torch.rand(64, 1, generator=g) - 0.5], 1)
    t = torch.cat([target[:, :4], torch.rand(64, 1, generator=g) - 0.5], 1)
    torch.testing.assert_close(
        SafeGDLoss('kld', representation='xy_stddev_pearson')(p, t),
        GDLoss('kld', representation='xy_stddev_pearson')(p, t),
    )


def test_per_call_options_as_upstream():
    # upstream's forward(**kwargs) overrides the constructor's options
    pred, target = _boxes(seed=5)
    for loss_type, option in (
        ('kld', dict(sqrt=False)),
        ('gwd', dict(normalize=False)),
    ):
        torch.testing.assert_close(
            SafeGDLoss(loss_type)(pred, target, **option),
            GDLoss(loss_type)(pred, target, **option),
        )
    with pytest.raises(ValueError, match=r"unknown options \['normalize'\]"):
        SafeGDLoss('kld')(pred, target, normalize=False)


THIN = ['zero_w_pred', 'zero_w_target', 'zero_w_both', 'ratio_1e6']


def _thin(case):
    pred, target = _boxes(seed=3)
    if case in ('zero_w_pred', 'zero_w_both'):
        pred[:, 2] = 0
    if case in ('zero_w_target', 'zero_w_both'):
        target[:, 2] = 0
    if case == 'ratio_1e6':
        pred[:, 2:4] = torch.tensor([1e-3, 2e3])
        target[:, 2:4] = torch.tensor([1e-3, 2e3])
    return pred, target


@pytest.mark.parametrize('loss_type', LOSS_TYPES)
@pytest.mark.parametrize('case', THIN)
def test_thin_boxes_finite_where_upstream_is_not(case, loss_type):
    pred, target = _thin(case)
    out, grad = _loss_and_grad(SafeGDLoss(loss_type), pred, target)
    assert torch.isfinite(out) and torch.isfinite(grad).all()
    exp, exp_grad = _loss_and_grad(GDLoss(loss_type), pred, target)
    if loss_type in ('kld', 'jd'):
        # fp32 Sigma.det() cancels to <= 0: log(det) is NaN
        assert not (torch.isfinite(exp) and torch.isfinite(exp_grad).all())
    if case == 'zero_w_pred' and loss_type == 'kld':
        # the loss itself (whether the gradient of the NaN rows is also
        # non-finite depends on the CPU's determinant routine)
        assert not torch.isfinite(exp)


@pytest.mark.parametrize('loss_type', ['kld', 'jd', 'gwd'])
def test_thin_box_values_match_float64_upstream(loss_type):
    """With an aspect ratio of 1e6, float64 still resolves the upstream
    determinant: it is the independent reference for the fp32 result."""
    pred, target = _thin('ratio_1e6')
    out = SafeGDLoss(loss_type, reduction='none')(pred, target)
    exp = GDLoss(loss_type, reduction='none')(pred.double(), target.double())
    torch.testing.assert_close(out.double(), exp, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_low_precision_and_autocast(dtype):
    pred, target = _boxes(seed=4)
    x = pred.to(dtype).requires_grad_()
    out = SafeGDLoss('kld')(x, target.to(dtype))
    out.backward()
    assert out.dtype == torch.float32
    assert torch.isfinite(out) and torch.isfinite(x.grad).all()
    exp = GDLoss('kld')(pred.to(dtype).float(), target.to(dtype).float())
    assert out.item() == pytest.approx(exp.item(), rel=1e-5)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = SafeGDLoss('gwd')(pred * 10, target * 10)
    assert out.dtype == torch.float32 and torch.isfinite(out)


# Inputs of mmrotate's own GDLoss test (mmrotate 1.x,
# tests/test_models/test_losses/test_loss.py::TestGDLoss): torch.rand boxes
# of shape (10, 5) ((0, 5) for 'gwd'), a (10, 5) weight, avg_factor=10,
# every reduction_override, and ValueError for avg_factor with 'sum'.
@pytest.mark.parametrize('fun', ['log1p', 'none', 'sqrt'])
@pytest.mark.parametrize(
    'loss_type,shape',
    [(t, (10, 5)) for t in LOSS_TYPES] + [('gwd', (0, 5))],
)
def test_mmrotate_unit_test_inputs(loss_type, shape, fun):
    g = torch.Generator().manual_seed(4)
    pred = torch.rand(shape, generator=g)
    target = torch.rand(shape, generator=g)
    weight = torch.rand(shape, generator=g)
    ours, ref = SafeGDLoss(loss_type, fun=fun), GDLoss(loss_type, fun=fun)
    calls = [
        ((), {}),
        ((weight,), {}),
        ((), dict(reduction_override='mean')),
        ((), dict(avg_factor=10)),
    ] + [
        ((), dict(avg_factor=10, reduction_override=r))
        for r in (None, 'none', 'mean')
    ]
    for args, kwargs in calls:
        out = ours(pred, target, *args, **kwargs)
        exp = ref(pred, target, *args, **kwargs)
        if not torch.isfinite(exp).all():
            # only the mean of no boxes: upstream 0 / 0, ours 0
            assert pred.numel() == 0 and out.item() == 0
            continue
        # upstream's fp32 determinant rounds (1e-5 relative on these small
        # boxes); its float64 value is the reference for ours
        exp64 = ref(
            pred.double(),
            target.double(),
            *(a.double() for a in args),
            **kwargs,
        )
        torch.testing.assert_close(out, exp, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(out.double(), exp64, rtol=2e-6, atol=1e-7)
    for loss in (ours, ref):
        with pytest.raises(ValueError):
            loss(pred, target, avg_factor=10, reduction_override='sum')


@pytest.mark.parametrize('reduction', ['none', 'mean', 'sum'])
def test_empty_and_zero_weight(reduction):
    x = torch.zeros(0, 5, requires_grad=True)
    out = SafeGDLoss('kld', reduction=reduction)(x, torch.zeros(0, 5))
    out.sum().backward()
    assert x.grad is not None and x.grad.shape == (0, 5)
    # upstream: 'none' gives shape (0, ) and 'sum' 0; its 'mean' of no
    # boxes is NaN, where the safe loss documents 0
    ref = GDLoss('kld', reduction=reduction)(
        torch.zeros(0, 5), torch.zeros(0, 5)
    )
    assert out.shape == ref.shape == {'none': (0,)}.get(reduction, ())
    assert out.dtype == ref.dtype == torch.float32
    if reduction == 'mean':
        assert math.isnan(ref.item()) and out.item() == 0.0
    elif reduction == 'sum':
        assert out.item() == ref.item() == 0.0
    pred, target = _boxes(n=4)
    pred[0, 0] = math.inf
    x = pred.requires_grad_()
    out = SafeGDLoss('kld')(x, target, torch.zeros(4))
    out.backward()
    assert out.item() == 0 and torch.isfinite(x.grad).all()


def test_bad_arguments():
    with pytest.raises(ValueError, match='loss_type'):
        SafeGDLoss('kfiou')
    with pytest.raises(ValueError, match='fun'):
        SafeGDLoss('kld', fun='exp')
    with pytest.raises(ValueError, match=r"unknown options \['normalize'\]"):
        SafeGDLoss('kld', normalize=True)
    with pytest.raises(ValueError, match=r'\(N, 5\)'):
        SafeGDLoss('kld')(torch.zeros(2, 4), torch.zeros(2, 4))


def test_build_from_config_in_mmrotate_scope():
    from mmrotate.registry import MODELS

    with DefaultScope.overwrite_default_scope('mmrotate'):
        for name in ('SafeGDLoss', 'mmnanguard.SafeGDLoss'):
            loss = MODELS.build(
                dict(
                    type=name,
                    loss_type='kld',
                    fun='log1p',
                    tau=1.0,
                    loss_weight=5.5,
                )
            )
            assert isinstance(loss, SafeGDLoss)
            assert (loss.loss_type, loss.tau, loss.loss_weight) == (
                'kld',
                1.0,
                5.5,
            )


def test_battery_gwd_boxes_of_1e6_px():
    """The battery's 'boxes of 1e6 px' case for 'gwd': the product of the
    two determinants overflows fp32, as upstream's does (value 0, as
    upstream); its backward was 0 * inf = nan."""
    loss = SafeGDLoss(loss_type='gwd')
    assert_loss_stable(loss, kind='gaussian')
    name = 'boxes of 1e6 px'
    case = next(c for c in battery_cases(loss, 'gaussian') if c.name == name)
    (pred, target), _ = case.make()
    pred = pred.detach()
    value, grad = _loss_and_grad(loss, pred, target)
    assert torch.isfinite(value) and torch.isfinite(grad).all()
    up_value, up_grad = _loss_and_grad(GDLoss('gwd'), pred, target)
    torch.testing.assert_close(value, up_value)
    torch.testing.assert_close(grad, up_grad)
    # by hand: det = (w h / 4)^2 per box; their product is above the fp32
    # range, so normalize divides by inf and log1p(0) = 0
    wh = torch.cat((pred[:, 2:4], target[:, 2:4]), 1).double()
    det_product = (wh.prod(1) / 16).square()
    assert (det_product > torch.finfo(torch.float32).max).all()
    assert value == 0
    # in float64 nothing overflows: ours and upstream agree, non-zero
    value64, grad64 = _loss_and_grad(loss, pred.double(), target.double())
    up64, up_grad64 = _loss_and_grad(
        GDLoss('gwd'), pred.double(), target.double()
    )
    assert value64 > 0
    torch.testing.assert_close(value64, up64)
    torch.testing.assert_close(grad64, up_grad64)
