# Copyright (c) mmnanguard contributors. All rights reserved.
"""The include on the model families that used to fail: Mask R-CNN (its
mask head's ``CrossEntropyLoss(use_mask=True)``), S2ANet and R3Det (refine
heads ``bbox_head_init`` / ``bbox_head_refine``) and OCRNet (a list
``decode_head``). Each is the real upstream config shrunk to ResNet-18,
with ``mmnanguard::_base_/nanguard.py`` added, on generated data, with a
fault injected at iteration 1: the incident is reported in that iteration,
the step is skipped (the parameters after it are those before it), and the
checkpoint is finite."""

import glob
import json
import os.path as osp

import pytest
import torch
from mmengine.hooks import Hook
from mmengine.registry import RUNNERS

from mmnanguard.datasets import ValidateAnnotations
from mmnanguard.engine.hooks import NanGuardHook
from mmnanguard.models.losses import CheckedCrossEntropyLoss
from mmnanguard.testing import load_tiny_config, tensors_all_finite
from mmnanguard.testing.tiny_configs import MIM_ROOT

TINY = osp.join(MIM_ROOT, 'configs', 'tiny')


class ParamRecorder(Hook):
    """Keeps a copy of the parameters after every training iteration."""

    priority = 'LOWEST'

    def __init__(self) -> None:
        self.after = []

    def after_train_iter(
        self, runner, batch_idx, data_batch=None, outputs=None
    ):
        self.after.append(
            {
                name: p.detach().clone()
                for name, p in runner.model.named_parameters()
            }
        )


def heads_classes(model, family):
    """``num_classes`` read by hand off the head each family trains."""
    if family == 'mask_rcnn':
        return model.roi_head.bbox_head.num_classes
    if family == 'ocrnet':
        return model.decode_head[-1].num_classes
    return model.bbox_head_init.num_classes


FAMILIES = [
    # family, tiny config, data kind, injected fault
    ('mask_rcnn', 'mask-rcnn_r18_fpn_tiny-coco.py', 'coco', 'inf_loss'),
    ('s2anet', 's2anet-le135_r18_fpn_tiny-dota.py', 'dota', 'nan_grad'),
    ('r3det', 'r3det-oc_r18_fpn_tiny-dota.py', 'dota', 'inf_loss'),
    ('ocrnet', 'ocrnet_r18-d8_tiny-cityscapes.py', 'cityscapes', 'nan_grad'),
]


@pytest.mark.parametrize('family, config, data, fault', FAMILIES)
def test_family_trains_protected(
    family,
    config,
    data,
    fault,
    tmp_path,
    tiny_coco_root,
    tiny_dota_root,
    tiny_cityscapes_root,
):
    roots = dict(
        coco=tiny_coco_root,
        dota=tiny_dota_root,
        cityscapes=tiny_cityscapes_root,
    )
    path = tmp_path / f'{family}_nanguard.py'
    path.write_text(
        f'_base_ = [{osp.join(TINY, config)!r}, '
        "'mmnanguard::_base_/nanguard.py']\n"
    )
    cfg = load_tiny_config(
        str(path),
        str(tmp_path),
        roots[data],
        max_iters=2,
        custom_hooks=[
            dict(type='FaultInjectionHook', fault=fault, iteration=1)
        ],
    )
    cfg.nanguard.hooks[1]['diagnose_incidents'] = 0  # the replay: elsewhere
    runner = RUNNERS.build(cfg)
    recorder = ParamRecorder()
    runner.register_hook(recorder)
    model = runner.model
    num_classes = heads_classes(model, family)
    assert runner.validate_transform['num_classes'] == num_classes
    runner.train()

    # ValidateAnnotations with the model's classes in the built pipeline
    transforms = runner.train_dataloader.dataset.pipeline.transforms
    checks = [t for t in transforms if isinstance(t, ValidateAnnotations)]
    assert len(checks) == 1 and checks[0].num_classes == num_classes
    assert type(transforms[-1]).__name__.startswith('Pack')
    # the labels of class-label cross-entropies are checked, masks are not
    if family == 'mask_rcnn':
        assert isinstance(
            model.roi_head.bbox_head.loss_cls, CheckedCrossEntropyLoss
        )
        assert not isinstance(
            model.roi_head.mask_head.loss_mask, CheckedCrossEntropyLoss
        )
    if family == 'ocrnet':
        for head in model.decode_head:
            assert isinstance(head.loss_decode, CheckedCrossEntropyLoss)

    guard = next(h for h in runner.hooks if isinstance(h, NanGuardHook))
    assert guard.counters['incidents'] == 1
    assert guard.counters['skipped'] == 1
    reports = glob.glob(str(tmp_path / 'nanguard' / '*' / 'report.json'))
    assert len(reports) == 1
    report = json.load(open(reports[0]))
    assert report['iteration'] == 1
    assert report['action'] == 'skip'
    expected_kind = (
        'nonfinite_loss' if fault == 'inf_loss' else 'nonfinite_grad'
    )
    assert report['kind'] == expected_kind
    # the skipped step left every parameter as it was after iteration 0
    before, after = recorder.after
    assert before.keys() == after.keys()
    for name in before:
        assert torch.equal(before[name], after[name]), name
    ckpt = torch.load(
        str(tmp_path / 'iter_2.pth'), map_location='cpu', weights_only=False
    )
    assert tensors_all_finite(ckpt['state_dict'])
    assert tensors_all_finite(ckpt['optimizer'])
    assert ckpt['nanguard']['counters']['skipped'] == 1
