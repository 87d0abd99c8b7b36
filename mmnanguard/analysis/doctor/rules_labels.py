# Copyright (c) mmnanguard contributors. All rights reserved.
"""Rule on segmentation labels: label maps that use 255 while a head
does not ignore 255 (read off a few samples' label maps)."""

import os.path as osp
from typing import List, Optional, Set, Tuple

import mmcv
import numpy as np
from mmengine.registry import DATASETS, MODELS

from mmnanguard.config_walk import (
    build_in_scope,
    is_loss_class,
    iter_typed_configs,
)
from mmnanguard.optional import is_available

from .context import DoctorContext, default_of
from .finding import Finding

IGNORE = 255


def _seg_dataset_cfg(ctx: DoctorContext) -> Optional[dict]:
    """The training dataset config if it is a segmentation dataset."""
    if not is_available('mmseg'):  # no segmentation dataset without mmseg
        return None
    from mmseg.datasets import BaseSegDataset

    loader = ctx.cfg.get('train_dataloader') or {}
    dataset = dict(loader.get('dataset') or {})
    while 'dataset' in dataset and 'type' in dataset:  # wrappers
        cls = ctx.resolve(dataset['type'], DATASETS)
        if isinstance(cls, type) and issubclass(cls, BaseSegDataset):
            break
        dataset = dict(dataset['dataset'])
    cls = ctx.resolve(dataset.get('type'), DATASETS)
    if isinstance(cls, type) and issubclass(cls, BaseSegDataset):
        return dataset
    return None


def label_values(ctx: DoctorContext, dataset_cfg: dict) -> Tuple[Set, List]:
    """Values in the label maps of the first samples of the dataset, as
    the model sees them (``reduce_zero_label`` maps 0 to 255).

    Returns:
        tuple: The set of values, and the label map paths read.
    """
    cfg = dict(dataset_cfg, pipeline=[], lazy_init=False, serialize_data=False)
    dataset = build_in_scope(cfg, ctx.scope, DATASETS)
    values: Set[int] = set()
    paths = []
    for i in range(min(ctx.label_samples, len(dataset))):
        path = dataset.get_data_info(i)['seg_map_path']
        label = mmcv.imread(path, flag='unchanged', backend='cv2')
        if label is None:
            raise FileNotFoundError(f'cannot read label map {path!r}')
        if dataset_cfg.get('reduce_zero_label'):
            label = np.where(label == 0, IGNORE, label)
        values |= set(int(v) for v in np.unique(label))
        paths.append(path)
    return values, paths


def _head_ignore_indexes(ctx: DoctorContext) -> List[Tuple[str, object]]:
    """(path, ignore_index) of every model module that takes one (losses
    left out: a decode head passes its own to its losses)."""
    found = []
    for path, cfg in iter_typed_configs(ctx.cfg.get('model') or {}):
        cls = ctx.resolve(cfg['type'], MODELS)
        if not isinstance(cls, type) or is_loss_class(cls):
            continue
        default = default_of(cls, 'ignore_index', 'absent')
        if 'ignore_index' in cfg or default != 'absent':
            found.append((path, cfg.get('ignore_index', default)))
    return found


def check_ignore_index(ctx: DoctorContext) -> List[Finding]:
    """Label maps with 255 and a head whose ``ignore_index`` is not 255."""
    dataset_cfg = _seg_dataset_cfg(ctx)
    if dataset_cfg is None:
        return []
    try:
        values, paths = label_values(ctx, dataset_cfg)
    except (FileNotFoundError, OSError, ValueError, KeyError) as err:
        return [
            Finding(
                'ignore-index-255',
                'info',
                f'could not read the label maps to check for 255: '
                f'{type(err).__name__}: {err}',
                "train_dataloader = dict(dataset=dict(data_root='...'))",
                'train_dataloader.dataset',
            )
        ]
    if IGNORE not in values:
        return []
    wrong = [(p, i) for p, i in _head_ignore_indexes(ctx) if i != IGNORE]
    if not wrong:
        return []
    where = osp.basename(paths[0]) if paths else ''
    return [
        Finding(
            'ignore-index-255',
            'error',
            f'label maps use 255 (e.g. {where}, {len(paths)} read) but '
            + ', '.join(f'{p}.ignore_index={i!r}' for p, i in wrong)
            + ': 255 is trained as a class index (out of range: NaN or '
            'a device assert)',
            f'{wrong[0][0]}.ignore_index=255',
            wrong[0][0],
        )
    ]
