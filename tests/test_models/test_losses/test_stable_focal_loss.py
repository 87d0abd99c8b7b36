# Copyright (c) mmnanguard contributors. All rights reserved.
import pytest
import torch
import torch.nn.functional as F
from mmdet.models.losses import FocalLoss
from mmdet.models.losses.focal_loss import py_sigmoid_focal_loss
from mmengine.registry import DefaultScope
from stack_marks import needs_mmrotate

from mmnanguard.analysis.loss_battery import battery_cases
from mmnanguard.models.losses import StableFocalLoss
from mmnanguard.testing import assert_loss_stable

pytestmark = pytest.mark.stack_smoke

NUM_CLASSES = 5


def _inputs(n=64, scale=3.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, NUM_CLASSES, generator=g) * scale
    # class indices, background = NUM_CLASSES
    labels = torch.randint(0, NUM_CLASSES + 1, (n,), generator=g)
    return logits, labels


def _focal_float64(logits, labels, gamma=2.0, alpha=0.25):
    """Independent element-wise focal loss in float64."""
    x = logits.double()
    t = F.one_hot(labels, NUM_CLASSES + 1)[:, :NUM_CLASSES].double()
    p = torch.sigmoid(x)
    p_t = p * t + (1 - p) * (1 - t)
    alpha_t = alpha * t + (1 - alpha) * (1 - t)
    ce = -(t * F.logsigmoid(x) + (1 - t) * F.logsigmoid(-x))
    return alpha_t * (1 - p_t) ** gamma * ce


def _focal_saturated(logits, labels, alpha=0.25):
    """Hand calculation for |x| >> 1: a wrong sign costs alpha_t * |x|,
    a right sign costs (about) nothing."""
    t = F.one_hot(labels, NUM_CLASSES + 1)[:, :NUM_CLASSES].bool()
    wrong = (logits > 0) != t
    alpha_t = torch.where(t, alpha, 1 - alpha).double()
    return torch.where(wrong, alpha_t * logits.double().abs(), 0.0)


@pytest.mark.parametrize('reduction', ['none', 'mean', 'sum'])
@pytest.mark.parametrize('gamma,alpha', [(2.0, 0.25), (1.5, 0.5), (0.5, 0.9)])
def test_matches_mmdet_focal_loss(reduction, gamma, alpha):
    logits, labels = _inputs()
    weight = torch.rand(logits.size(0))
    ours = StableFocalLoss(
        gamma=gamma, alpha=alpha, reduction=reduction, loss_weight=2.0
    )
    ref = FocalLoss(
        gamma=gamma, alpha=alpha, reduction=reduction, loss_weight=2.0
    )
    x1 = logits.clone().requires_grad_()
    x2 = logits.clone().requires_grad_()
    out, exp = ours(x1, labels, weight), ref(x2, labels, weight)
    torch.testing.assert_close(out, exp, rtol=1e-5, atol=1e-5)
    out.sum().backward()
    exp.sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-5, atol=1e-5)
    # avg_factor and reduction_override
    torch.testing.assert_close(
        ours(logits, labels, avg_factor=7.0, reduction_override='mean'),
        ref(logits, labels, avg_factor=7.0, reduction_override='mean'),
        rtol=1e-5,
        atol=1e-5,
    )


def test_matches_float64_reference_on_wide_logits():
    logits, labels = _inputs(n=256, scale=15.0)
    out = StableFocalLoss(reduction='none')(logits, labels)
    exp = _focal_float64(logits, labels)
    torch.testing.assert_close(out.double(), exp, rtol=1e-5, atol=1e-6)


def test_matches_mmdet_with_one_hot_and_soft_targets():
    logits, labels = _inputs()
    one_hot = F.one_hot(labels, NUM_CLASSES + 1)[:, :NUM_CLASSES]
    for target in (one_hot, torch.rand(logits.shape)):
        out = StableFocalLoss(reduction='none')(logits, target)
        exp = py_sigmoid_focal_loss(logits, target, reduction='none')
        torch.testing.assert_close(out, exp, rtol=1e-5, atol=1e-6)


def test_matches_mmdet_activated():
    logits, labels = _inputs()
    probs = logits.sigmoid()
    out = StableFocalLoss(activated=True)(probs, labels)
    exp = FocalLoss(activated=True)(probs, labels)
    torch.testing.assert_close(out, exp, rtol=1e-5, atol=1e-6)


def test_weight_shapes():
    logits, labels = _inputs(n=8)
    loss = StableFocalLoss(reduction='sum')
    full = torch.rand(8, NUM_CLASSES)
    # (N * C, ) is reshaped to (N, C), as in mmdet
    torch.testing.assert_close(
        loss(logits, labels, full.flatten()), loss(logits, labels, full)
    )
    with pytest.raises(ValueError, match='weight of shape'):
        loss(logits, labels, torch.rand(3))


def test_mmcv_sigmoid_focal_op():
    """mmcv 2.0.1's sigmoid_focal_loss has CUDA/MLU/NPU kernels only."""
    from mmcv.ops import sigmoid_focal_loss

    logits, labels = _inputs()
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError):
            sigmoid_focal_loss(logits, labels, 2.0, 0.25, None, 'mean')
        return
    out = StableFocalLoss()(logits.cuda(), labels.cuda())
    exp = sigmoid_focal_loss(
        logits.cuda(), labels.cuda(), 2.0, 0.25, None, 'mean'
    )
    torch.testing.assert_close(out, exp, rtol=1e-5, atol=1e-5)


ADVERSARIAL = {
    'logit+1e4': 1e4,
    'logit-1e4': -1e4,
    'logit+-1e4': 'mixed',
}


@pytest.mark.parametrize('gamma', [0.5, 1.0, 2.0])
@pytest.mark.parametrize('case', list(ADVERSARIAL))
def test_finite_for_saturated_logits(case, gamma):
    logits, labels = _inputs(n=32)
    value = ADVERSARIAL[case]
    if value == 'mixed':
        logits = torch.sign(logits) * 1e4
    else:
        logits = torch.full_like(logits, value)
    x = logits.requires_grad_()
    loss = StableFocalLoss(gamma=gamma)(x, labels)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(x.grad).all()
    exp = _focal_saturated(logits.detach(), labels).mean()
    assert loss.item() == pytest.approx(exp.item(), rel=1e-5)


def test_upstream_gradient_is_nan_for_saturated_logits_gamma_below_one():
    logits, labels = _inputs(n=32)
    x = (torch.sign(logits) * 1e4).requires_grad_()
    FocalLoss(gamma=0.5)(x, labels).backward()
    assert not torch.isfinite(x.grad).all()


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_low_precision_inputs(dtype):
    logits, labels = _inputs()
    x = logits.to(dtype).requires_grad_()
    loss = StableFocalLoss()(x, labels)
    loss.backward()
    assert loss.dtype == torch.float32
    assert torch.isfinite(loss) and torch.isfinite(x.grad).all()
    exp = _focal_float64(logits.to(dtype).float(), labels).mean()
    assert loss.item() == pytest.approx(exp.item(), rel=1e-5)
    # saturated low-precision logits
    x = (torch.sign(logits) * 6e4).to(dtype).requires_grad_()
    loss = StableFocalLoss()(x, labels)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(x.grad).all()


def test_cpu_autocast():
    logits, labels = _inputs()
    layer = torch.nn.Linear(NUM_CLASSES, NUM_CLASSES)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        x = layer(logits * 1e3)
        assert x.dtype == torch.bfloat16
        loss = StableFocalLoss()(x, labels)
    assert loss.dtype == torch.float32
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(layer.weight.grad).all()


@pytest.mark.parametrize('gamma', [0.5, 2.0])
@pytest.mark.parametrize('prob', [0.0, 1.0, 1e-30, 1 - 1e-7])
def test_activated_exact_zero_and_one(prob, gamma):
    logits, labels = _inputs(n=16)
    p = torch.full_like(logits, prob).requires_grad_()
    loss = StableFocalLoss(activated=True, gamma=gamma)(p, labels)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(p.grad).all()
    # mmdet's value (its BCE clamps log at -100, so it is finite here)
    up = FocalLoss(activated=True, gamma=gamma)(p.detach(), labels)
    assert torch.isfinite(up)
    torch.testing.assert_close(loss, up, rtol=1e-5, atol=1e-6)
    # by hand: per element alpha_t * (1 - p_t)^gamma * min(-log p_t, 100)
    t = F.one_hot(labels, NUM_CLASSES + 1)[:, :NUM_CLASSES].double()
    pd = torch.tensor(prob).double()  # the fp32 value the loss saw
    p_t = pd * t + (1 - pd) * (1 - t)
    nll = (-torch.log(p_t)).clamp(max=100)
    alpha_t = 0.25 * t + 0.75 * (1 - t)
    exp = (alpha_t * (1 - p_t) ** gamma * nll).mean()
    assert loss.item() == pytest.approx(exp.item(), rel=1e-4, abs=1e-12)


def test_activated_eps_is_an_explicit_clamp():
    logits, labels = _inputs(n=16)
    p = torch.zeros_like(logits)
    clamped = StableFocalLoss(activated=True, eps=1e-6)(p, labels)
    exp = _focal_float64(
        torch.logit(torch.full_like(logits, 1e-6).double()), labels
    ).mean()
    assert clamped.item() == pytest.approx(exp.item(), rel=1e-4)
    assert clamped.item() < StableFocalLoss(activated=True)(p, labels).item()


# Input shapes of mmdet's own FocalLoss test (mmdet 3.x,
# tests/test_models/test_losses/test_loss.py::test_FocalLoss_loss): (10, 5)
# logits with class indices, and (3, 5, 40, 40) with one-hot targets.
@pytest.mark.parametrize('input_shape', [(10, 5), (3, 5, 40, 40)])
def test_mmdet_unit_test_inputs(input_shape):
    g = torch.Generator().manual_seed(3)
    pred = torch.rand(input_shape, generator=g)
    target = torch.randint(0, 5, (input_shape[0],), generator=g)
    if len(input_shape) == 4:
        b, n, w, h = input_shape
        target = F.one_hot(
            torch.randint(0, 5, (b * w * h,), generator=g), 5
        ).reshape(b, w, h, n)
        target = target.permute(0, 3, 1, 2)
    ours, ref = StableFocalLoss(), FocalLoss()
    for kwargs in (
        {},
        dict(reduction_override='mean'),
        dict(avg_factor=10),
        dict(avg_factor=10, reduction_override='none'),
        dict(reduction_override='sum'),
    ):
        torch.testing.assert_close(
            ours(pred, target, **kwargs),
            ref(pred, target, **kwargs),
            rtol=1e-5,
            atol=1e-7,
        )
    # mmdet refuses avg_factor with 'sum' (ValueError), and so do we
    for loss in (ours, ref):
        with pytest.raises(ValueError):
            loss(pred, target, avg_factor=10, reduction_override='sum')
    if len(input_shape) == 4:  # element-wise weight of the loss's shape
        weight = torch.rand(input_shape, generator=g)
        torch.testing.assert_close(
            ours(pred, target, weight), ref(pred, target, weight)
        )


@pytest.mark.parametrize('reduction', ['none', 'mean', 'sum'])
def test_empty_input(reduction):
    x = torch.zeros(0, NUM_CLASSES, requires_grad=True)
    loss = StableFocalLoss(reduction=reduction)(x, torch.zeros(0).long())
    loss.sum().backward()
    assert torch.isfinite(loss).all()
    assert loss.numel() == 0 or loss.item() == 0


def test_bad_arguments():
    with pytest.raises(ValueError, match='use_sigmoid'):
        StableFocalLoss(use_sigmoid=False)
    with pytest.raises(ValueError, match='reduction must be one of'):
        StableFocalLoss(reduction='avg')
    with pytest.raises(ValueError, match='reduction_override'):
        StableFocalLoss()(*_inputs(), reduction_override='avg')
    with pytest.raises(ValueError, match='target must be class indices'):
        StableFocalLoss()(torch.zeros(4, 3), torch.zeros(4, 2))


@pytest.mark.parametrize(
    'scope', ['mmdet', pytest.param('mmrotate', marks=needs_mmrotate)]
)
def test_build_from_config_in_scope(scope):
    import importlib

    registry = importlib.import_module(f'{scope}.registry')
    cfg = dict(type='StableFocalLoss', gamma=1.5, alpha=0.3)
    with DefaultScope.overwrite_default_scope(scope):
        for type_name in ('StableFocalLoss', 'mmnanguard.StableFocalLoss'):
            loss = registry.MODELS.build(dict(cfg, type=type_name))
            assert isinstance(loss, StableFocalLoss)
            assert (loss.gamma, loss.alpha) == (1.5, 0.3)


def test_battery_fp16_saturated_probabilities():
    """The battery's 'fp16 autocast, logits ±1e4' case with
    ``activated=True``: probabilities exactly 0 and 1 in fp16. BCE's
    backward gave ~1e12 there (inf in fp16); the value is mmdet's."""
    loss = StableFocalLoss(activated=True)
    assert_loss_stable(loss, kind='classification')
    name = 'fp16 autocast, logits ±1e4'
    case = next(
        c for c in battery_cases(loss, 'classification') if c.name == name
    )
    (probs, labels), kwargs = case.make()
    p = probs.detach().half().requires_grad_()
    with torch.autocast('cpu', dtype=torch.float16):
        out = loss(p, labels, **kwargs)
    out.backward()
    assert torch.isfinite(out) and torch.isfinite(p.grad).all()
    pd = p.detach().double()
    assert ((pd == 0) | (pd == 1)).all() and (pd == 0).any()
    up = FocalLoss(activated=True)(p.detach().float(), labels)
    torch.testing.assert_close(out, up)
    # by hand: alpha_t (1 - p_t)^2 min(-log p_t, 100); the clamped nll is
    # flat, so the gradient is the modulating factor's alone
    c = p.size(1)
    t = F.one_hot(labels, c + 1)[:, :c].double()
    p_t = pd * t + (1 - pd) * (1 - t)
    nll = (-torch.log(p_t)).clamp(max=100)
    alpha_t = 0.25 * t + 0.75 * (1 - t)
    expected = (alpha_t * (1 - p_t) ** 2 * nll).mean()
    torch.testing.assert_close(out.double(), expected)
    grad = alpha_t * nll * 2 * (1 - p_t) * (1 - 2 * t) / p.numel()
    torch.testing.assert_close(p.grad.double(), grad, rtol=1e-3, atol=0)
