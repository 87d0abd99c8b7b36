# Copyright (c) mmnanguard contributors. All rights reserved.
"""The include on the model families that used to fail: Mask R-CNN (its
mask head's ``CrossEntropyLoss(use_mask=True)``), S2ANet and R3Det (refine
heads ``bbox_head_init`` / ``bbox_head_refine``) and OCRNet (a list
``decode_head``). Each is the real upstream config shrunk to ResNet-18,
with ``mmnanguard::_base_/nanguard.py`` added, on generated data, with a
fault injected at iteration 1 (the session's runs of
``tests/family_runs.py``): the incident is reported in that iteration, the
step is skipped (the parameters after it are those before it), and the
checkpoint is finite."""

import glob
import json
import os.path as osp

import pytest
import torch
from family_runs import FAULT_ITER, MAX_ITERS

from mmnanguard.datasets import ValidateAnnotations
from mmnanguard.engine.hooks import NanGuardHook
from mmnanguard.models.losses import CheckedCrossEntropyLoss
from mmnanguard.testing import tensors_all_finite


def heads_classes(model, family):
    """``num_classes`` read by hand off the head each family trains."""
    if family == 'mask_rcnn_coco':
        return model.roi_head.bbox_head.num_classes
    if family == 'ocrnet_cityscapes':
        return model.decode_head[-1].num_classes
    return model.bbox_head_init.num_classes


# the runs of tests/family_runs.py: an inf loss or a NaN gradient
FAMILIES = ['mask_rcnn_coco', 's2anet_dota', 'r3det_dota', 'ocrnet_cityscapes']


@pytest.mark.slow
@pytest.mark.parametrize('family', FAMILIES)
def test_family_trains_protected(family, family_runs):
    run = family_runs(family)
    runner, work_dir = run['runner'], run['work_dir']
    model = runner.model
    num_classes = heads_classes(model, family)
    assert runner.validate_transform['num_classes'] == num_classes

    # ValidateAnnotations with the model's classes in the built pipeline
    transforms = runner.train_dataloader.dataset.pipeline.transforms
    checks = [t for t in transforms if isinstance(t, ValidateAnnotations)]
    assert len(checks) == 1 and checks[0].num_classes == num_classes
    assert type(transforms[-1]).__name__.startswith('Pack')
    # the labels of class-label cross-entropies are checked, masks are not
    if family == 'mask_rcnn_coco':
        assert isinstance(
            model.roi_head.bbox_head.loss_cls, CheckedCrossEntropyLoss
        )
        assert not isinstance(
            model.roi_head.mask_head.loss_mask, CheckedCrossEntropyLoss
        )
    if family == 'ocrnet_cityscapes':
        for head in model.decode_head:
            assert isinstance(head.loss_decode, CheckedCrossEntropyLoss)

    guard = next(h for h in runner.hooks if isinstance(h, NanGuardHook))
    assert guard.counters['incidents'] == 1
    assert guard.counters['skipped'] == 1
    reports = glob.glob(osp.join(work_dir, 'nanguard', '*', 'report.json'))
    assert len(reports) == 1
    with open(reports[0]) as f:
        report = json.load(f)
    assert report['iteration'] == FAULT_ITER
    assert report['action'] == 'skip'
    expected_kind = (
        'nonfinite_loss' if run['fault'] == 'inf_loss' else 'nonfinite_grad'
    )
    assert report['kind'] == expected_kind
    # the training set's annotation file: one COCO json; none for DOTA's
    # folder of annfiles or Cityscapes' label images
    dataset = runner.train_dataloader.dataset
    if family == 'mask_rcnn_coco':
        assert osp.samefile(report['ann_file'], dataset.ann_file)
        assert report['ann_file'].endswith('.json')
    else:
        assert report['ann_file'] is None
    # the skipped step left every parameter as it was after iteration 0
    before, after = run['params_after']
    assert before.keys() == after.keys()
    for name in before:
        assert torch.equal(before[name], after[name]), name
    ckpt = torch.load(
        osp.join(work_dir, f'iter_{MAX_ITERS}.pth'),
        map_location='cpu',
        weights_only=False,
    )
    assert tensors_all_finite(ckpt['state_dict'])
    assert tensors_all_finite(ckpt['optimizer'])
    assert ckpt['nanguard']['counters']['skipped'] == 1
