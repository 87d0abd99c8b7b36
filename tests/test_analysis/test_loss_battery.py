# Copyright (c) mmnanguard contributors. All rights reserved.
"""The loss battery on upstream mmdet / mmrotate / mmseg losses and on our
safe modules: verdicts, and values against float64 recomputations."""

import math

import pytest
import torch
import torch.nn as nn

from mmnanguard.analysis.loss_battery import (
    battery_cases,
    check_loss_config,
    infer_kind,
    run_battery,
    run_case,
)
from mmnanguard.config_walk import build_in_scope


def _result(results, name):
    return next(r for r in results if r.case == name)


def _case(loss, name, **settings):
    return next(c for c in battery_cases(loss, **settings) if c.name == name)


@pytest.mark.parametrize(
    'cfg, scope, kind',
    [
        (dict(type='FocalLoss'), 'mmdet', 'classification'),
        (dict(type='CrossEntropyLoss'), 'mmdet', 'classification'),
        (dict(type='CrossEntropyLoss'), 'mmseg', 'segmentation'),
        (dict(type='DiceLoss'), 'mmdet', 'mask'),
        (dict(type='DiceLoss'), 'mmseg', 'segmentation'),
        (dict(type='GIoULoss'), 'mmdet', 'box'),
        (dict(type='SmoothL1Loss'), 'mmdet', 'box'),
        (dict(type='GDLoss', loss_type='kld'), 'mmrotate', 'gaussian'),
        (dict(type='RotatedIoULoss'), 'mmrotate', 'rotated_box'),
        (dict(type='ConvexGIoULoss'), 'mmrotate', 'quad'),
        (dict(type='SafeGDLoss', loss_type='gwd'), 'mmrotate', 'gaussian'),
        (dict(type='SafeDiceLoss'), 'mmseg', 'segmentation'),
        (
            dict(type='CheckedCrossEntropyLoss', impl='mmseg'),
            'mmseg',
            'segmentation',
        ),
    ],
)
def test_kind_is_read_off_the_built_class(cfg, scope, kind):
    assert infer_kind(build_in_scope(cfg, scope), scope) == kind


def test_unknown_kind_names_the_class():
    class Mystery(nn.Module):
        def forward(self, a, b):
            return (a - b).sum()

    with pytest.raises(ValueError, match='Mystery.*kind='):
        infer_kind(Mystery())


def test_l1_values_match_float64():
    loss = build_in_scope(dict(type='L1Loss'), 'mmdet')
    for name in ('nominal', 'boxes of 1e6 px', "reduction 'sum'"):
        case = _case(loss, name)
        (pred, target), kwargs = case.make()
        diff = (pred.detach().double() - target.double()).abs()
        total = diff.sum() if kwargs else diff.mean()
        result = run_case(loss, case)
        assert result.verdict == 'finite'
        assert result.value == pytest.approx(float(total), rel=1e-5)
        # d mean|x| / dx = sign / numel (sum: sign)
        assert result.grad == pytest.approx(
            1.0 if kwargs else 1 / diff.numel()
        )


def test_mmdet_focal_is_finite_on_saturated_logits():
    """On the CPU mmdet's FocalLoss runs the python formula, which goes
    through binary_cross_entropy_with_logits: finite at logits of ±1e4,
    with the value of the float64 formula."""
    loss = build_in_scope(dict(type='FocalLoss'), 'mmdet')
    case = _case(loss, 'confidently wrong (logits ∓1e4)', num_classes=4)
    (logits, labels), _ = case.make()
    x = logits.detach().double()
    t = nn.functional.one_hot(labels, 5)[:, :4].double()
    p = x.sigmoid()
    pt = (1 - p) * t + p * (1 - t)
    alpha = 0.25 * t + 0.75 * (1 - t)
    bce = nn.functional.binary_cross_entropy_with_logits(
        x, t, reduction='none'
    )
    expected = float((bce * alpha * pt.pow(2)).mean())
    result = run_case(loss, case)
    assert result.verdict == 'finite'
    assert result.value == pytest.approx(expected, rel=1e-5)
    assert math.isfinite(result.grad)


def test_mmrotate_kld_fails_on_zero_width_boxes():
    results = run_battery(
        build_in_scope(dict(type='GDLoss', loss_type='kld'), 'mmrotate')
    )
    assert _result(results, 'nominal').verdict == 'finite'
    for name in ('zero-width target box', 'zero-height target box'):
        assert _result(results, name).verdict == 'non-finite value'
    # a finite value hiding a NaN gradient: only a backward pass finds it
    both = _result(results, 'zero-area prediction and target')
    assert math.isfinite(both.value)
    assert both.verdict == 'non-finite gradient'


def test_drop_in_is_named_and_passes_the_failing_cases():
    report = check_loss_config(
        dict(type='GDLoss', loss_type='kld'), 'mmrotate', 'model.loss'
    )
    assert report.drop_in == 'SafeGDLoss'
    failed = {r.case for r in report.failures}
    assert {'zero-width target box', 'zero-width predicted box'} <= failed
    safe = {r.case: r for r in report.drop_in_results}
    assert set(safe) == failed
    for name in ('zero-width target box', 'zero-width predicted box'):
        assert safe[name].verdict == 'finite'


def test_gradient_check_finds_the_torch_where_trap():
    class WhereLoss(nn.Module):
        """-log(p) where the target is set, 0 elsewhere: where p = 0 off
        the target, the unused branch is inf and its gradient NaN."""

        def forward(self, cls_score, label):
            p = cls_score.sigmoid()
            hot = nn.functional.one_hot(label, cls_score.size(1)).bool()
            return torch.where(hot, -torch.log(p), torch.zeros_like(p)).mean()

    loss = WhereLoss()
    case = _case(loss, 'prediction identical to target')
    with torch.no_grad():
        args, _ = case.make()
        assert torch.isfinite(loss(*args))  # a no_grad check passes
    result = run_case(loss, case)
    assert math.isfinite(result.value)
    assert result.verdict == 'non-finite gradient'


def test_module_is_not_modified():
    loss = build_in_scope(dict(type='FocalLoss', loss_weight=2.0), 'mmdet')
    before = dict(vars(loss))
    run_battery(loss)
    assert loss.loss_weight == 2.0 and loss.reduction == 'mean'
    assert dict(vars(loss)).keys() == before.keys()
    assert loss.training


def test_fp16_case_runs_in_fp16():
    """Boxes of 100-200 px in fp16 are rounded to 1/8 px: the value is
    that of the rounded inputs, not of the fp32 ones."""
    loss = build_in_scope(dict(type='L1Loss'), 'mmdet')
    case = _case(loss, 'fp16 autocast')
    (pred, target), _ = case.make()
    fp32 = float((pred.detach().double() - target.double()).abs().mean())
    rounded = (pred.detach().half().double() - target.half().double()).abs()
    fp16 = run_case(loss, case)
    assert fp16.value == pytest.approx(float(rounded.mean()), rel=2e-3)
    assert abs(fp16.value - fp32) > 1e-3


@pytest.mark.parametrize(
    'cfg, scope',
    [
        (dict(type='StableFocalLoss'), 'mmdet'),
        (dict(type='SafeGDLoss', loss_type='kld'), 'mmrotate'),
        (dict(type='SafeGDLoss', loss_type='jd'), 'mmrotate'),
        (dict(type='SafeRotatedIoULoss'), 'mmrotate'),
        (dict(type='SafeDiceLoss'), 'mmdet'),
        (dict(type='SafeDiceLoss', use_sigmoid=False), 'mmseg'),
        (dict(type='CheckedCrossEntropyLoss', impl='mmseg'), 'mmseg'),
    ],
)
def test_safe_modules_pass_every_case(cfg, scope):
    results = run_battery(build_in_scope(cfg, scope), scope=scope)
    failed = [(r.case, r.verdict, r.message) for r in results if not r.passed]
    assert failed == []
    groups = {r.group for r in results}
    assert {
        'nominal',
        'empty',
        'predictions',
        'precision',
        'weights',
    } <= groups


def test_label_cases_pass_a_loud_refusal():
    """CheckedCrossEntropyLoss refuses label 255 with a message; the
    battery counts that as a pass, and mmseg's plain loss errors."""
    checked = run_battery(
        build_in_scope(
            dict(type='CheckedCrossEntropyLoss', impl='mmseg'), 'mmseg'
        ),
        scope='mmseg',
    )
    refused = _result(checked, 'labels 255, loss default ignore_index')
    assert refused.verdict == 'rejected'
    assert 'InvalidLabelError' in refused.message and '255' in refused.message
