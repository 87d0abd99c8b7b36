# Copyright (c) mmnanguard contributors. All rights reserved.
"""check_labels on a class-label cross-entropy of any toolbox, found by
its values: torch's own ``nn.CrossEntropyLoss`` and a hand-written one get
the label check (values out of ``[0, C)`` refused with the value and the
module named, ``ignore_index`` allowed, soft targets passed through); the
losses that are not a softmax cross-entropy of class indices (mmdet's
focal, smooth-L1 and GIoU losses, a class-weighted one) are left alone;
mmdet's own ``CrossEntropyLoss`` keeps its wrapper. mmpretrain's is
``tests/test_toolboxes/test_mmpretrain.py``."""

import pytest
import torch
import torch.nn.functional as F
from mmdet.models.losses import (
    CrossEntropyLoss,
    FocalLoss,
    GIoULoss,
    SmoothL1Loss,
)
from torch import nn

from mmnanguard.engine.runner.label_checks import wrap_cross_entropy
from mmnanguard.engine.runner.label_range_check import (
    hook_cross_entropy,
    is_class_label_cross_entropy,
)
from mmnanguard.models.losses import CheckedCrossEntropyLoss, InvalidLabelError


class HandWrittenCrossEntropyLoss(nn.Module):
    """A user's loss: ``-log softmax`` at the label, times a weight."""

    def __init__(self, loss_weight=2.0, ignore_index=None):
        super().__init__()
        self.loss_weight = loss_weight
        if ignore_index is not None:
            self.ignore_index = ignore_index

    def forward(self, cls_score, label, weight=None):
        logp = cls_score.log_softmax(1)
        keep = label != getattr(self, 'ignore_index', -100)
        picked = logp[keep].gather(1, label[keep, None]).squeeze(1)
        return -self.loss_weight * picked.mean()


class Head(nn.Module):
    def __init__(self, loss):
        super().__init__()
        self.fc = nn.Linear(4, 5)
        self.loss_cls = loss


@pytest.mark.parametrize(
    'loss, expected',
    [
        (nn.CrossEntropyLoss(), True),
        (nn.CrossEntropyLoss(reduction='sum'), True),
        (nn.CrossEntropyLoss(reduction='none'), True),
        (HandWrittenCrossEntropyLoss(), True),
        (FocalLoss(), False),  # sigmoid focal, not softmax
        (SmoothL1Loss(), False),
        (GIoULoss(), False),  # raises on class scores
        (nn.CrossEntropyLoss(weight=torch.tensor([1.0, 2.0, 3.0])), False),
        (nn.CrossEntropyLoss(label_smoothing=0.1), False),
    ],
)
def test_a_cross_entropy_is_told_by_its_values(loss, expected):
    assert is_class_label_cross_entropy(loss) is expected


@pytest.mark.parametrize(
    'make',
    [nn.CrossEntropyLoss, HandWrittenCrossEntropyLoss],
    ids=['torch', 'hand-written'],
)
@pytest.mark.parametrize('bad', [5, 7, -1, 255])
def test_a_label_out_of_range_is_refused_by_name(make, bad):
    loss = make()
    model = Head(loss)
    assert hook_cross_entropy(model) == ['model.loss_cls']
    assert type(model.loss_cls) is type(loss)  # not wrapped
    scores = torch.randn(4, 5)
    good = torch.tensor([0, 4, 2, 1])
    expected = F.cross_entropy(scores, good) * getattr(loss, 'loss_weight', 1)
    assert torch.allclose(model.loss_cls(scores, good), expected)
    with pytest.raises(InvalidLabelError) as err:
        model.loss_cls(scores, torch.tensor([0, bad, 2, 1]))
    message = str(err.value)
    assert f'label value {bad} is outside [0, 5)' in message
    assert f'{type(loss).__name__} at model.loss_cls' in message


def test_the_modules_ignore_index_and_soft_targets_pass():
    model = Head(nn.CrossEntropyLoss(ignore_index=255))
    assert hook_cross_entropy(model) == ['model.loss_cls']
    scores = torch.randn(3, 5)
    model.loss_cls(scores, torch.tensor([255, 1, 2]))
    with pytest.raises(InvalidLabelError, match='label value 254'):
        model.loss_cls(scores, torch.tensor([254, 1, 2]))
    plain = Head(nn.CrossEntropyLoss())
    assert hook_cross_entropy(plain) == ['model.loss_cls']
    soft = torch.softmax(torch.randn(3, 5), 1)  # probabilities: not checked
    expected = F.cross_entropy(scores, soft)
    assert torch.allclose(plain.loss_cls(scores, soft), expected)


def test_mmdet_cross_entropy_keeps_its_wrapper_and_is_not_hooked_twice():
    model = Head(CrossEntropyLoss())
    assert wrap_cross_entropy(model) == ['loss_cls']
    assert isinstance(model.loss_cls, CheckedCrossEntropyLoss)
    assert hook_cross_entropy(model) == []
    other = Head(nn.CrossEntropyLoss())
    assert hook_cross_entropy(other) == ['model.loss_cls']
    assert hook_cross_entropy(other) == []  # once
    assert len(other.loss_cls._forward_pre_hooks) == 1


class SequenceModuleLoss(nn.Module):
    """A loss of a toolbox's own inputs (as mmocr's ``CEModuleLoss``): it
    takes the decoder's ``(N, T, C)`` outputs and per-sample targets, and
    holds the cross-entropy that gets ``(N, C, T)`` scores and ``(N, T)``
    character indices, padded with ``ignore_index``."""

    def __init__(self, padding=3):
        super().__init__()
        self.loss_ce = nn.CrossEntropyLoss(ignore_index=padding)

    def forward(self, outputs, data_samples):
        targets = torch.stack([s['indices'] for s in data_samples])
        return dict(loss_ce=self.loss_ce(outputs.permute(0, 2, 1), targets))


def test_the_cross_entropy_inside_another_loss_is_checked():
    head = Head(SequenceModuleLoss())
    assert not is_class_label_cross_entropy(head.loss_cls)
    assert hook_cross_entropy(head) == ['model.loss_cls.loss_ce']
    outputs = torch.randn(2, 4, 3)  # 2 words, 4 steps, 3 characters
    good = [dict(indices=torch.tensor([0, 2, 3, 3]))] * 2
    expected = F.cross_entropy(
        outputs.permute(0, 2, 1),
        torch.stack([s['indices'] for s in good]),
        ignore_index=3,
    )
    assert torch.allclose(head.loss_cls(outputs, good)['loss_ce'], expected)
    bad = good[:1] + [dict(indices=torch.tensor([0, 4, 3, 3]))]
    with pytest.raises(InvalidLabelError) as err:
        head.loss_cls(outputs, bad)
    assert 'label value 4 is outside [0, 3)' in str(err.value)
    assert 'CrossEntropyLoss at model.loss_cls.loss_ce' in str(err.value)
