# Copyright (c) mmnanguard contributors. All rights reserved.
"""Load the tiny real configs of ``configs/tiny`` against generated data."""

import os.path as osp
import uuid
from typing import Any, Optional

import torch
from mmengine.config import Config

_PACKAGE = osp.dirname(osp.dirname(osp.abspath(__file__)))
#: The folder that holds ``configs/`` and ``tools/``: ``mmnanguard/.mim``,
#: which ``setup.py`` fills in an installed wheel and links into the
#: repository in an editable install; the repository itself before either.
MIM_ROOT = (
    osp.join(_PACKAGE, '.mim')
    if osp.isdir(osp.join(_PACKAGE, '.mim', 'configs'))
    else osp.dirname(_PACKAGE)
)
TINY_DOTA_CONFIG = osp.join(
    MIM_ROOT,
    'configs',
    'tiny',
    'rotated-retinanet-rbox-le90_r18_tiny-dota.py',
)
TINY_COCO_CONFIG = osp.join(
    MIM_ROOT, 'configs', 'tiny', 'retinanet_r18_fpn_tiny-coco.py'
)


def load_tiny_config(
    path: str,
    work_dir: str,
    data_root: str,
    max_iters: Optional[int] = None,
    **overrides: Any,
) -> Config:
    """Load a tiny config, pointed at ``data_root`` and ``work_dir``.

    Args:
        path (str): Config file, e.g. :data:`TINY_DOTA_CONFIG`.
        work_dir (str): The run's work dir.
        data_root (str): Folder written by a ``mmnanguard.datagen``
            generator (with a trailing separator or not).
        max_iters (int, optional): Switch to an ``IterBasedTrainLoop`` of
            this many iterations, with a checkpoint every ``max_iters``
            iterations (override ``default_hooks.checkpoint`` to change).
        **overrides: Merged into the config with ``Config.merge_from_dict``
            (dotted keys allowed).

    Returns:
        Config: The config, ready for ``Runner.from_cfg``.
    """
    cfg = Config.fromfile(path)
    cfg.work_dir = work_dir
    # unique: mmengine reuses a Visualizer/logger of the same name
    cfg.experiment_name = f'{osp.basename(path)[:-3]}_{uuid.uuid4().hex[:8]}'
    cfg.train_dataloader.dataset.data_root = osp.join(data_root, '')
    if max_iters is not None:
        cfg.train_cfg = dict(
            type='IterBasedTrainLoop', max_iters=max_iters, val_interval=10**9
        )
        cfg.default_hooks.checkpoint = dict(
            type='CheckpointHook', interval=max_iters, by_epoch=False
        )
        cfg.log_processor.by_epoch = False
        for scheduler in cfg.param_scheduler:
            scheduler.by_epoch = False
            scheduler.pop('convert_to_iter_based', None)
    cfg.merge_from_dict(overrides)
    return cfg


def tensors_all_finite(obj: Any) -> bool:
    """Whether every floating tensor nested in ``obj`` is finite.

    Args:
        obj: A tensor, or dicts / lists / tuples of them (a checkpoint, a
            state dict, an optimizer state).
    """
    if isinstance(obj, torch.Tensor):
        return not obj.is_floating_point() or bool(torch.isfinite(obj).all())
    if isinstance(obj, dict):
        return all(tensors_all_finite(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return all(tensors_all_finite(v) for v in obj)
    return True
