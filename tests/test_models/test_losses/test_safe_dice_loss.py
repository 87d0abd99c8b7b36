# Copyright (c) mmnanguard contributors. All rights reserved.
import pytest
import torch
from mmdet.models.losses import DiceLoss as MMDetDiceLoss
from mmengine.registry import DefaultScope
from mmseg.models.losses import DiceLoss as MMSegDiceLoss

from mmnanguard.models.losses import SafeDiceLoss

pytestmark = pytest.mark.stack_smoke


def _masks(n=4, c=3, hw=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, c, hw, hw, generator=g) * 2
    labels = torch.randint(0, c, (n, hw, hw), generator=g)
    return logits, labels


def _dice64(p, t, eps, naive):
    """Independent per-sample dice loss in float64."""
    p, t = p.double().flatten(1), t.double().flatten(1)
    a = (p * t).sum(1)
    if naive:
        return 1 - (2 * a + eps) / (p.sum(1) + t.sum(1) + eps)
    return 1 - 2 * a / ((p * p).sum(1) + (t * t).sum(1) + 2 * eps)


@pytest.mark.parametrize('naive_dice', [False, True])
@pytest.mark.parametrize('reduction', ['none', 'mean', 'sum'])
@pytest.mark.parametrize('shape', [(4, 3, 16, 16), (8, 300)])
def test_matches_mmdet_dice(naive_dice, reduction, shape):
    # (8, 300): mmdet's flattened masks, where index 255 is not a class
    logits = torch.randn(shape) * 2
    target = (torch.rand(logits.shape) > 0.5).float()
    weight = torch.rand(logits.size(0))
    ours = SafeDiceLoss(
        naive_dice=naive_dice, reduction=reduction, loss_weight=3.0
    )
    ref = MMDetDiceLoss(
        naive_dice=naive_dice, reduction=reduction, loss_weight=3.0
    )
    x1, x2 = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    out, exp = ours(x1, target, weight), ref(x2, target, weight)
    torch.testing.assert_close(out, exp, rtol=1e-5, atol=1e-6)
    out.sum().backward()
    exp.sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(
        ours(logits, target, avg_factor=3.0, reduction_override='mean'),
        ref(logits, target, avg_factor=3.0, reduction_override='mean'),
    )


@pytest.mark.parametrize('use_sigmoid', [True, False])
@pytest.mark.parametrize('naive_dice', [False, True])
def test_matches_mmseg_dice_with_index_targets(use_sigmoid, naive_dice):
    logits, labels = _masks()
    ours = SafeDiceLoss(use_sigmoid=use_sigmoid, naive_dice=naive_dice)
    ref = MMSegDiceLoss(use_sigmoid=use_sigmoid, naive_dice=naive_dice)
    torch.testing.assert_close(
        ours(logits, labels), ref(logits, labels), rtol=1e-5, atol=1e-6
    )
    # the same value by hand, in float64
    p = logits.sigmoid() if use_sigmoid else logits.softmax(1)
    t = torch.nn.functional.one_hot(labels, 3).permute(0, 3, 1, 2)
    exp = _dice64(p, t, 1e-3, naive_dice).mean()
    assert ours(logits, labels).item() == pytest.approx(exp.item(), rel=1e-5)


def test_ignored_pixels_count_as_in_mmseg_by_default():
    # mmseg clamps labels into [0, C]: 255 (and 7) get an all-zero target,
    # the prediction on them still counts; negative labels become class 0
    logits, labels = _masks()
    odd = labels.clone()
    odd[:, :4] = 255
    odd[:, 4:6] = 7
    odd[:, 6] = -1
    for kwargs in ({}, dict(use_sigmoid=False), dict(ignore_index=None)):
        ours = SafeDiceLoss(**kwargs)(logits, odd, ignore_index=255)
        ref = MMSegDiceLoss(**kwargs)(logits, odd, ignore_index=255)
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    p = logits.sigmoid()
    t = torch.nn.functional.one_hot(odd.clamp(0, 3), 4)[..., :3]
    exp = _dice64(p, t.permute(0, 3, 1, 2), 1e-3, False).mean()
    assert SafeDiceLoss()(logits, odd).item() == pytest.approx(
        exp.item(), rel=1e-5
    )


def test_exclude_ignored_leaves_ignored_pixels_out():
    logits, labels = _masks()
    ignored = labels.clone()
    ignored[:, :4] = 255
    p = logits.sigmoid()
    t = torch.nn.functional.one_hot(labels, 3).permute(0, 3, 1, 2)
    keep = (ignored != 255)[:, None].expand_as(p)
    exp = _dice64(p * keep, t * keep, 1e-3, False).mean()
    out = SafeDiceLoss(ignore_index=255, exclude_ignored=True)(logits, ignored)
    assert out.item() == pytest.approx(exp.item(), rel=1e-5)
    with pytest.raises(ValueError, match='label value 7'):
        SafeDiceLoss(exclude_ignored=True)(logits, torch.full_like(labels, 7))


# Inputs and expected values of the upstream unit tests: mmdet 3.x
# tests/test_models/test_losses/test_loss.py::test_dice_loss ((10, 4, 4)
# masks, weight (10, )) and mmseg 1.x tests/test_models/test_losses/
# test_dice_loss.py (index targets, pred == target gives exactly 0,
# ignore_index dropping a channel).
@pytest.mark.parametrize('naive_dice', [True, False])
def test_mmdet_unit_test_inputs(naive_dice):
    g = torch.Generator().manual_seed(1)
    pred = torch.rand((10, 4, 4), generator=g)
    target = torch.rand((10, 4, 4), generator=g)
    weight = torch.rand(10, generator=g)
    ours = SafeDiceLoss(naive_dice=naive_dice)
    ref = MMDetDiceLoss(naive_dice=naive_dice)
    for args, kwargs in (
        ((), {}),
        ((weight,), {}),
        ((), dict(reduction_override='mean')),
        ((), dict(avg_factor=10)),
        ((), dict(avg_factor=10, reduction_override='none')),
    ):
        torch.testing.assert_close(
            ours(pred, target, *args, **kwargs),
            ref(pred, target, *args, **kwargs),
            rtol=1e-6,
            atol=1e-7,
        )
    for loss in (ours, ref):
        with pytest.raises(ValueError):
            loss(pred, target, avg_factor=10, reduction_override='sum')


@pytest.mark.parametrize('naive_dice', [True, False])
def test_mmseg_unit_test_inputs(naive_dice):
    g = torch.Generator().manual_seed(2)
    pred = torch.rand((1, 10, 4, 4), generator=g)
    target = torch.randint(0, 10, (1, 4, 4), generator=g)
    weight = torch.rand(1, generator=g)
    for use_sigmoid in (True, False):
        for args in ((), (weight,)):
            torch.testing.assert_close(
                SafeDiceLoss(use_sigmoid=use_sigmoid, naive_dice=naive_dice)(
                    pred, target, *args
                ),
                MMSegDiceLoss(use_sigmoid=use_sigmoid, naive_dice=naive_dice)(
                    pred, target, *args
                ),
                rtol=1e-6,
                atol=1e-7,
            )
    # index targets give the same loss as their one-hot form
    pred = torch.tensor([[[[1, 1], [1, 0]], [[0, 1], [1, 1]]]]).float()
    index = torch.tensor([[[0, 0], [0, 1]]])
    one_hot = torch.tensor([[[[1, 1], [1, 0]], [[0, 0], [0, 1]]]])
    loss = SafeDiceLoss(naive_dice=naive_dice)
    assert torch.equal(loss(pred, index), loss(pred, one_hot))
    # pred == target, eps = 0, V-Net: exactly 0
    target = torch.randint(0, 2, (1, 10, 4, 4), generator=g)
    out = SafeDiceLoss(naive_dice=False, eps=0)(
        target.float(), target.sigmoid(), weight
    )
    assert out.item() == 0
    # ignore_index=1 drops channel 1; channel 0 matches: exactly 0
    target = torch.tensor([[[[1, 1], [1, 0]], [[1, 0], [0, 1]]]]).sigmoid()
    out = SafeDiceLoss(naive_dice=False, ignore_index=1, eps=0)(
        pred, target, weight
    )
    assert out.item() == 0


CASES = ['empty_gt_zero_pred', 'empty_gt', 'zero_pred', 'all_ignored']


@pytest.mark.parametrize('eps', [0.0, 1e-3])
@pytest.mark.parametrize('naive_dice', [False, True])
@pytest.mark.parametrize('case', CASES)
def test_empty_masks_are_finite_and_defined(case, naive_dice, eps):
    pred = torch.rand(2, 1, 8, 8)
    target = (torch.rand(2, 1, 8, 8) > 0.5).float()
    if case in ('empty_gt_zero_pred', 'empty_gt'):
        target.zero_()
    if case in ('empty_gt_zero_pred', 'zero_pred'):
        pred.zero_()
    if case == 'all_ignored':  # index targets, every pixel ignored
        target = torch.full((2, 8, 8), 255)
    pred.requires_grad_()
    loss = SafeDiceLoss(
        activate=False,
        eps=eps,
        naive_dice=naive_dice,
        reduction='none',
        exclude_ignored=case == 'all_ignored',
    )
    out = loss(pred, target)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(pred.grad).all()
    if case in ('empty_gt_zero_pred', 'all_ignored'):
        # documented: 0 / 0 is a perfect match (loss 0); with eps > 0 the
        # upstream formula applies unchanged (V-Net gives 1, naive 0)
        expected = 1.0 if (eps > 0 and not naive_dice) else 0.0
        torch.testing.assert_close(out, torch.full((2,), expected))
    else:
        exp = _dice64(pred.detach(), target, eps, naive_dice).float()
        torch.testing.assert_close(out, exp, rtol=1e-5, atol=1e-6)
    if eps == 0 and case != 'all_ignored':
        up = MMDetDiceLoss(
            activate=False, eps=eps, naive_dice=naive_dice, reduction='none'
        )(pred.detach(), target)
        if case == 'empty_gt_zero_pred':
            assert not torch.isfinite(up).all()


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_low_precision_large_masks(dtype):
    # 256 x 256 ones: upstream's fp16 sum of squares overflows 65504 to
    # inf, and the loss silently becomes 1 (the fp32 value is 0.80)
    pred = torch.full((1, 1, 256, 256), 10.0, dtype=dtype, requires_grad=True)
    target = torch.ones(1, 1, 256, 256, dtype=dtype)
    out = SafeDiceLoss(activate=False)(pred, target)
    out.backward()
    assert torch.isfinite(out) and torch.isfinite(pred.grad).all()
    exp = _dice64(pred.detach().float(), target.float(), 1e-3, False).mean()
    assert out.item() == pytest.approx(exp.item(), rel=1e-5)
    if dtype == torch.float16:
        up = MMDetDiceLoss(activate=False)(pred.detach(), target)
        assert abs(up.item() - exp.item()) > 0.1
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = SafeDiceLoss()(pred.float() * 100, target)
    assert out.dtype == torch.float32 and torch.isfinite(out)


def test_empty_batch():
    pred = torch.zeros(0, 3, 4, 4, requires_grad=True)
    out = SafeDiceLoss()(pred, torch.zeros(0, 3, 4, 4))
    out.backward()
    assert out.item() == 0


def test_bad_arguments():
    with pytest.raises(ValueError, match='eps'):
        SafeDiceLoss(eps=-1.0)
    with pytest.raises(ValueError, match='reduction'):
        SafeDiceLoss(reduction='avg')
    with pytest.raises(ValueError, match='one per sample'):
        SafeDiceLoss()(torch.zeros(2, 4), torch.zeros(2, 4), torch.ones(3))


@pytest.mark.parametrize('scope', ['mmdet', 'mmseg'])
def test_build_from_config_in_scope(scope):
    import importlib

    registry = importlib.import_module(f'{scope}.registry')
    with DefaultScope.overwrite_default_scope(scope):
        for name in ('SafeDiceLoss', 'mmnanguard.SafeDiceLoss'):
            loss = registry.MODELS.build(
                dict(type=name, naive_dice=True, eps=1.0)
            )
            assert isinstance(loss, SafeDiceLoss)
            assert loss.naive_dice and loss.eps == 1.0
