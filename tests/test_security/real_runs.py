# Copyright (c) mmnanguard contributors. All rights reserved.
"""One short real run per supported config family, shared by the tests.

Each run trains the tiny config with the ``mmnanguard`` include for 2
iterations with an ``inf`` loss planted at iteration 1: it leaves a real
mmengine checkpoint (``iter_2.pth``) and a real incident folder (with
``batch.pth``, ``report.json``, ``config.py`` and ``model.pth``).
"""

import glob
import os.path as osp
from typing import Any, Dict

from mmengine.config import Config
from mmengine.registry import RUNNERS

from mmnanguard.testing import load_tiny_config
from mmnanguard.testing.tiny_configs import MIM_ROOT

NANGUARD = osp.join(MIM_ROOT, 'configs', 'nanguard')
TINY = osp.join(MIM_ROOT, 'configs', 'tiny')
#: family -> (config, data fixture, data classes its batch.pth holds)
FAMILIES = {
    'rotated_retinanet_dota': (
        osp.join(
            NANGUARD, 'rotated-retinanet-rbox-le90_r18_nanguard_tiny-dota.py'
        ),
        'tiny_dota_root',
        {'DetDataSample', 'InstanceData', 'RotatedBoxes'},
    ),
    'retinanet_coco': (
        osp.join(TINY, 'retinanet_r18_fpn_tiny-coco.py'),
        'tiny_coco_root',
        {'DetDataSample', 'InstanceData', 'HorizontalBoxes'},
    ),
    'fcn_cityscapes': (
        osp.join(NANGUARD, 'fcn_r18-d8_nanguard_tiny-cityscapes.py'),
        'tiny_cityscapes_root',
        {'SegDataSample', 'PixelData'},
    ),
    'rotated_rtmdet_ema_dota': (
        osp.join(NANGUARD, 'rotated-rtmdet_tiny_nanguard_tiny-dota.py'),
        'tiny_dota_root',
        {'DetDataSample', 'InstanceData', 'RotatedBoxes'},
    ),
    'mask_rcnn_coco': (
        osp.join(TINY, 'mask-rcnn_r18_fpn_tiny-coco.py'),
        'tiny_coco_root',
        {'DetDataSample', 'InstanceData', 'HorizontalBoxes', 'BitmapMasks'},
    ),
}
#: The families whose checkpoints are resumed (a Mask R-CNN checkpoint
#: holds what the others hold; its batch adds the masks).
RESUMED = (
    'rotated_retinanet_dota',
    'retinanet_coco',
    'fcn_cityscapes',
    'rotated_rtmdet_ema_dota',
)
#: What a real mmengine checkpoint references beyond torch's defaults.
CHECKPOINT_GLOBALS = {
    'builtins.getattr',
    'mmengine.logging.history_buffer.HistoryBuffer',
    'numpy._core.multiarray._reconstruct',
    'numpy._core.multiarray.scalar',
    'numpy.dtype',
    'numpy.ndarray',
}
FAULT = dict(type='FaultInjectionHook', fault='inf_loss', iteration=1)


def family_cfg(
    config: str, work_dir: str, data_root: str, max_iters: int, **overrides
) -> Config:
    """The family's config with the planted fault, for ``max_iters``."""
    cfg = load_tiny_config(config, work_dir, data_root, max_iters=max_iters)
    cfg.custom_hooks = list(cfg.get('custom_hooks', [])) + [FAULT]
    cfg.merge_from_dict(overrides)
    return cfg


def run_family(family: str, tmp_dir: str, data_root: str) -> Dict[str, Any]:
    """Train ``family`` for 2 iterations under ``tmp_dir``.

    Returns:
        dict: ``family``, ``config``, ``data_root``, ``work_dir``,
        ``checkpoint`` and ``incident`` (paths).
    """
    config = FAMILIES[family][0]
    if osp.dirname(config) == TINY:  # add the include, as a user does
        base, config = config, osp.join(tmp_dir, f'{family}_nanguard.py')
        with open(config, 'w') as f:
            f.write(f"_base_ = [{base!r}, 'mmnanguard::_base_/nanguard.py']\n")
    work_dir = osp.join(tmp_dir, 'work')
    RUNNERS.build(family_cfg(config, work_dir, data_root, 2)).train()
    (incident,) = glob.glob(osp.join(work_dir, 'nanguard', 'incident_*'))
    return dict(
        family=family,
        config=config,
        data_root=data_root,
        work_dir=work_dir,
        checkpoint=osp.join(work_dir, 'iter_2.pth'),
        incident=incident,
    )
