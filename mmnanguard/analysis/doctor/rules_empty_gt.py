# Copyright (c) mmnanguard contributors. All rights reserved.
"""Rule on empty ground truth: a ``filter_cfg`` that keeps images without
boxes for a detector whose dense head cannot take them (tried on the
built head, see :mod:`.empty_gt_probe`)."""

from typing import List, Tuple

from mmengine.registry import DATASETS, MODELS

from .context import DoctorContext
from .empty_gt_probe import probe_empty_gt
from .finding import Finding

RULE = 'empty-gt-kept'


def _filtering_dataset(ctx: DoctorContext):
    """The training dataset config that takes a ``filter_cfg`` (an
    mmengine ``BaseDataset``; wrappers unwrapped), and its class; (None,
    None) if there is none."""
    from mmengine.dataset import BaseDataset

    loader = ctx.cfg.get('train_dataloader') or {}
    dataset = dict(loader.get('dataset') or {})
    while dataset:
        cls = ctx.resolve(dataset.get('type'), DATASETS)
        if isinstance(cls, type) and issubclass(cls, BaseDataset):
            return dataset, cls
        dataset = dict(dataset.get('dataset') or {})
    return None, None


def _dense_heads(ctx: DoctorContext) -> List[Tuple[str, dict]]:
    """(path, head config with train/test settings) of the model's dense
    heads (one-stage heads and RPNs; ROI heads are not probed)."""
    from mmdet.models.dense_heads import RPNHead
    from mmdet.models.dense_heads.base_dense_head import BaseDenseHead

    model = ctx.cfg.get('model') or {}
    heads = []
    for key, value in model.items():
        if not isinstance(value, dict) or 'type' not in value:
            continue
        cls = ctx.resolve(value['type'], MODELS)
        if not (isinstance(cls, type) and issubclass(cls, BaseDenseHead)):
            continue
        train, test = model.get('train_cfg'), model.get('test_cfg')
        if issubclass(cls, RPNHead):
            train = (train or {}).get('rpn')
            test = (test or {}).get('rpn')
        cfg = dict(value)
        cfg.setdefault('train_cfg', train)
        cfg.setdefault('test_cfg', test)
        heads.append((f'model.{key}', cfg))
    return heads


def check_empty_gt(ctx: DoctorContext) -> List[Finding]:
    """Images without ground truth kept for a head that fails on them."""
    dataset, cls = _filtering_dataset(ctx)
    if dataset is None:
        return []
    rotated = cls.__module__.startswith('mmrotate')
    if (dataset.get('filter_cfg') or {}).get('filter_empty_gt') is True:
        return []
    findings = []
    for path, head_cfg in _dense_heads(ctx):
        failure, unknown = probe_empty_gt(head_cfg, ctx.scope, rotated)
        if failure is not None:
            findings.append(
                Finding(
                    RULE,
                    'error',
                    f'the training set keeps images without boxes (no '
                    f'filter_cfg.filter_empty_gt=True), and {path} '
                    f'({head_cfg["type"]}) cannot take one: with one box '
                    f'its loss is finite; without, {failure}',
                    'train_dataloader = dict(dataset=dict('
                    'filter_cfg=dict(filter_empty_gt=True)))',
                    path,
                )
            )
        elif unknown is not None:
            findings.append(
                Finding(
                    RULE,
                    'info',
                    f'could not try {path} on an image without boxes: '
                    f'{unknown}',
                    'train_dataloader = dict(dataset=dict('
                    'filter_cfg=dict(filter_empty_gt=True)))',
                    path,
                )
            )
    return findings
