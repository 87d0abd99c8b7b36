# Copyright (c) mmnanguard contributors. All rights reserved.
import pytest
import torch
from mmdet.models.losses import CrossEntropyLoss as MMDetCE
from mmengine.registry import DefaultScope
from mmseg.models.losses import CrossEntropyLoss as MMSegCE
from stack_marks import needs_mmrotate

from mmnanguard.analysis.loss_battery import battery_cases
from mmnanguard.models.losses import (
    CheckedCrossEntropyLoss,
    check_cross_entropy_labels,
)
from mmnanguard.testing import assert_loss_stable

pytestmark = pytest.mark.stack_smoke

NUM_CLASSES = 19


def _seg(seed=0, void=False):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, NUM_CLASSES, 8, 8, generator=g)
    labels = torch.randint(0, NUM_CLASSES, (2, 8, 8), generator=g)
    if void:
        labels[:, :2] = 255
    return logits, labels


def test_check_function_accepts_valid_and_ignored_labels():
    labels = torch.tensor([0, 5, 18, 255])
    check_cross_entropy_labels(labels, 19, ignore_index=255)
    check_cross_entropy_labels(torch.zeros(0).long(), 19)


@pytest.mark.parametrize('bad', [255, 19, -1, 1000])
def test_check_function_names_value_num_classes_and_ignore_index(bad):
    labels = torch.tensor([0, 3, bad, bad])
    with pytest.raises(ValueError) as err:
        check_cross_entropy_labels(labels, 19, ignore_index=-100)
    msg = str(err.value)
    assert f'label value {bad}' in msg
    assert 'num_classes=19' in msg and 'ignore_index=-100' in msg
    assert '2 of 4 labels' in msg
    assert ('ignore_index=255' in msg) == (bad == 255)


def test_check_function_rejects_float_labels():
    with pytest.raises(TypeError, match='integer'):
        check_cross_entropy_labels(torch.zeros(3), 19)


@pytest.mark.parametrize('avg_non_ignore', [False, True])
def test_mmseg_values_match_upstream(avg_non_ignore):
    logits, labels = _seg(void=True)
    cfg = dict(
        use_sigmoid=False, loss_weight=0.4, avg_non_ignore=avg_non_ignore
    )
    ours = CheckedCrossEntropyLoss(impl='mmseg', **cfg)
    ref = MMSegCE(**cfg)
    out = ours(logits, labels, ignore_index=255)
    torch.testing.assert_close(out, ref(logits, labels, ignore_index=255))
    # by hand: PyTorch's cross_entropy over the non-ignored pixels
    ce = torch.nn.functional.cross_entropy(
        logits, labels, ignore_index=255, reduction='sum'
    )
    n = (
        labels.numel() - int((labels == 255).sum())
        if avg_non_ignore
        else labels.numel()
    )
    assert out.item() == pytest.approx(0.4 * ce.item() / n, rel=1e-5)
    assert ours.loss_name == 'loss_ce'


def test_mmseg_cityscapes_void_without_ignore_index_raises():
    logits, labels = _seg(void=True)
    loss = CheckedCrossEntropyLoss(impl='mmseg')
    with pytest.raises(ValueError) as err:
        loss(logits, labels)  # mmseg's forward default: ignore_index=-100
    msg = str(err.value)
    assert 'label value 255' in msg and 'num_classes=19' in msg
    assert 'ignore_index=-100' in msg and 'set ignore_index=255' in msg
    # upstream fails with an opaque error (CPU) / device assert (CUDA)
    with pytest.raises((IndexError, RuntimeError)):
        MMSegCE()(logits, labels)


@pytest.mark.parametrize('use_sigmoid', [False, True])
def test_mmdet_values_match_upstream(use_sigmoid):
    g = torch.Generator().manual_seed(1)
    channels = NUM_CLASSES + (0 if use_sigmoid else 1)
    logits = torch.randn(32, channels, generator=g)
    # mmdet: background is label NUM_CLASSES
    labels = torch.randint(0, NUM_CLASSES + 1, (32,), generator=g)
    weight = torch.rand(32)
    ours = CheckedCrossEntropyLoss(impl='mmdet', use_sigmoid=use_sigmoid)
    ref = MMDetCE(use_sigmoid=use_sigmoid)
    torch.testing.assert_close(
        ours(logits, labels, weight, avg_factor=20.0),
        ref(logits, labels, weight, avg_factor=20.0),
    )
    bad = labels.clone()
    bad[3] = NUM_CLASSES + 1
    with pytest.raises(ValueError, match=f'label value {NUM_CLASSES + 1}'):
        ours(logits, bad)


def test_mmseg_binary_sigmoid_range():
    logits = torch.randn(2, 1, 4, 4)
    labels = torch.randint(0, 2, (2, 4, 4))
    loss = CheckedCrossEntropyLoss(impl='mmseg', use_sigmoid=True)
    torch.testing.assert_close(
        loss(logits, labels, ignore_index=255),
        MMSegCE(use_sigmoid=True)(logits, labels, ignore_index=255),
    )
    labels[0, 0, 0] = 2
    with pytest.raises(ValueError, match=r'outside \[0, 2\)'):
        loss(logits, labels, ignore_index=255)


def test_ignore_index_from_constructor():
    logits, labels = _seg(void=True)
    loss = CheckedCrossEntropyLoss(impl='mmdet', ignore_index=255)
    out = loss(logits, labels)
    assert torch.isfinite(out)
    torch.testing.assert_close(out, MMDetCE(ignore_index=255)(logits, labels))


def test_impl_from_scope_and_bad_impl():
    for scope, impl in (
        ('mmseg', 'mmseg'),
        ('mmdet', 'mmdet'),
        ('mmrotate', 'mmdet'),
    ):
        with DefaultScope.overwrite_default_scope(scope):
            assert CheckedCrossEntropyLoss().impl == impl
    with DefaultScope.overwrite_default_scope('mmengine'):
        with pytest.raises(ValueError, match="impl='mmdet' or"):
            CheckedCrossEntropyLoss()
    with pytest.raises(ValueError, match="got 'mmcls'"):
        CheckedCrossEntropyLoss(impl='mmcls')


@pytest.mark.parametrize(
    'scope', ['mmseg', 'mmdet', pytest.param('mmrotate', marks=needs_mmrotate)]
)
def test_build_from_config_in_scope(scope):
    import importlib

    registry = importlib.import_module(f'{scope}.registry')
    with DefaultScope.overwrite_default_scope(scope):
        for name in (
            'CheckedCrossEntropyLoss',
            'mmnanguard.CheckedCrossEntropyLoss',
        ):
            loss = registry.MODELS.build(
                dict(type=name, use_sigmoid=False, loss_weight=2.0)
            )
            assert isinstance(loss, CheckedCrossEntropyLoss)
            assert loss.impl == ('mmseg' if scope == 'mmseg' else 'mmdet')
            assert loss.loss.loss_weight == 2.0


@pytest.mark.parametrize('use_sigmoid', [False, True])
def test_battery_mmdet_mean_over_zero_samples(use_sigmoid):
    """The battery's 'no targets (0 samples)' case: mmdet's mean is
    0 / 0 = nan there; ours is 0 with a zero gradient, and equals
    upstream where upstream is finite on 0 samples."""
    loss = CheckedCrossEntropyLoss(impl='mmdet', use_sigmoid=use_sigmoid)
    assert_loss_stable(loss, kind='classification')
    name = 'no targets (0 samples)'
    case = next(
        c for c in battery_cases(loss, 'classification') if c.name == name
    )
    (scores, labels), kwargs = case.make()
    assert scores.numel() == 0 and not kwargs
    ref = MMDetCE(use_sigmoid=use_sigmoid)
    assert torch.isnan(ref(scores.detach(), labels))
    x = scores.detach().clone().requires_grad_()
    out = loss(x, labels)
    out.backward()
    assert out.shape == ref(scores.detach(), labels).shape
    assert out.item() == 0 and x.grad.shape == x.shape
    for kw in (
        dict(reduction_override='sum'),
        dict(avg_factor=0),
        dict(avg_factor=3.0),
        dict(reduction_override='none'),
    ):
        torch.testing.assert_close(
            loss(scores.detach(), labels, **kw),
            ref(scores.detach(), labels, **kw),
        )
