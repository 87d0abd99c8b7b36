# Copyright (c) mmnanguard contributors. All rights reserved.
"""check_loss runs each loss on inputs of the form it takes: the GFL
family (DistributionFocalLoss, QualityFocalLoss, GIoULoss) on
distributions, quality pairs and boxes, values against float64."""

import os.path as osp

import pytest
import torch
import torch.nn.functional as F
from mmengine.config import Config

from mmnanguard.analysis.loss_battery import (
    battery_cases,
    check_config_losses,
    check_loss_config,
    infer_kind,
    run_case,
)
from mmnanguard.config_walk import build_in_scope

MMDET_CONFIGS = osp.join(
    osp.dirname(__import__('mmdet').__file__), '.mim', 'configs'
)


def _case(loss, name):
    return next(c for c in battery_cases(loss) if c.name == name)


def _dfl64(pred, target):
    """GFL paper, eq. 6: -((y_r - y) log S_l + (y - y_l) log S_r)."""
    logp = torch.log_softmax(pred.double(), 1)
    left = target.double().floor()
    rows = torch.arange(len(target))
    return -(
        (left + 1 - target.double()) * logp[rows, left.long()]
        + (target.double() - left) * logp[rows, left.long() + 1]
    )


def test_distribution_focal_loss_gets_distributions():
    dfl = build_in_scope(dict(type='DistributionFocalLoss'), 'mmdet')
    assert infer_kind(dfl) == 'distribution'
    report = check_loss_config(dict(type='DistributionFocalLoss'), 'mmdet')
    assert report.kind == 'distribution'
    assert not [r for r in report.results if r.verdict == 'error']
    verdicts = {r.case: r.verdict for r in report.results}
    assert verdicts['nominal'] == 'finite'
    assert verdicts['logits ±1e4'] == 'finite'
    # a distance of n has no right bin n+1: refused loudly, not a NaN
    assert verdicts['distance = n (16, no bin n+1)'] == 'rejected'
    for name in ('nominal', 'distances on the edges (0 and 15.9)'):
        (pred, target), _ = _case(dfl, name).make()
        result = run_case(dfl, _case(dfl, name))
        assert result.value == pytest.approx(
            float(_dfl64(pred, target).mean()), rel=1e-6
        )


def _qfl64(pred, labels, scores, beta=2.0):
    """GFL paper, eq. 5: -|y - s|^b ((1 - y) log(1 - s) + y log s) with
    y the quality score on the labelled class, 0 elsewhere."""
    sig = pred.double().sigmoid()
    y = torch.zeros_like(sig)
    fg = labels < pred.shape[1]
    y[fg.nonzero()[:, 0], labels[fg]] = scores[fg].double()
    bce = -(y * torch.log(sig) + (1 - y) * torch.log1p(-sig))
    return (bce * (y - sig).abs() ** beta).sum(1)


def test_quality_focal_loss_on_upstream_values():
    # the inputs of mmdet's own test_QualityFocalLoss_Loss
    torch.manual_seed(0)
    pred = torch.rand(4, 5)
    label = torch.tensor([0, 1, 2, 0])
    quality = torch.rand(4)
    qfl = build_in_scope(dict(type='QualityFocalLoss'), 'mmdet')
    assert infer_kind(qfl) == 'classification'
    value = qfl(pred, (label, quality))
    assert float(value) == pytest.approx(
        float(_qfl64(pred, label, quality).mean()), rel=1e-5
    )
    # upstream's property: the one-hot * quality tensor form is the same
    hot = F.one_hot(label, 5) * quality[:, None]
    assert float(qfl(pred, hot)) == pytest.approx(float(value), rel=1e-6)
    report = check_loss_config(dict(type='QualityFocalLoss'), 'mmdet')
    nominal = next(r for r in report.results if r.case == 'nominal')
    (scores, (labels, q)), _ = _case(qfl, 'nominal').make()
    assert nominal.value == pytest.approx(
        float(_qfl64(scores, labels, q).mean()), rel=1e-5
    )


def test_one_hot_losses_get_one_hot_targets():
    report = check_loss_config(dict(type='VarifocalLoss'), 'mmdet')
    assert report.kind == 'classification'
    assert {r.verdict for r in report.results if r.group == 'predictions'} == {
        'finite'
    }
    assert not [r for r in report.results if r.verdict == 'error']


def test_the_whole_gfl_family_runs_on_its_own_forms():
    cfg = Config.fromfile(
        osp.join(MMDET_CONFIGS, 'gfl', 'gfl_r50_fpn_1x_coco.py')
    )
    reports = {r.path.split('.')[-1]: r for r in check_config_losses(cfg)}
    assert {k: r.kind for k, r in reports.items()} == {
        'loss_cls': 'classification',
        'loss_dfl': 'distribution',
        'loss_bbox': 'box',
    }
    for report in reports.values():
        assert not report.error
        errors = [r for r in report.results if r.verdict == 'error']
        assert errors == [], (report.loss_type, errors)
        nominal = next(r for r in report.results if r.case == 'nominal')
        assert nominal.verdict == 'finite'
