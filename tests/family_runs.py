# Copyright (c) mmnanguard contributors. All rights reserved.
"""Short real runs of the tiny config families, each made once per test
session and shared by the tests that read the same run
(``tests/test_integration/test_include_families.py``,
``tests/test_security/``).

Each run trains the family's tiny config with the ``mmnanguard`` include
(the config of ``configs/nanguard/`` or, for one of ``configs/tiny/``, a
two-line config adding it, as a user does) for 2 iterations, with a fault
planted at iteration 1. It leaves a real mmengine checkpoint
(``iter_2.pth``), a real incident folder (``batch.pth``, ``report.json``,
and where the incident is diagnosed ``config.py`` and ``model.pth``), the
built runner and the parameters after each iteration.
"""

import glob
import os.path as osp
from typing import Any, Dict, List

import pytest
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.registry import RUNNERS

from mmnanguard.testing import load_tiny_config
from mmnanguard.testing.tiny_configs import MIM_ROOT

NANGUARD = osp.join(MIM_ROOT, 'configs', 'nanguard')
TINY = osp.join(MIM_ROOT, 'configs', 'tiny')
MAX_ITERS = 2
FAULT_ITER = 1
#: family -> (config, data fixture, fault planted at iteration 1); the
#: families of :data:`NOT_DIAGNOSED` skip the in-training diagnosis (no
#: test reads its replay), the others write ``config.py`` and ``model.pth``
RUNS = {
    'rotated_retinanet_dota': (
        osp.join(
            NANGUARD, 'rotated-retinanet-rbox-le90_r18_nanguard_tiny-dota.py'
        ),
        'tiny_dota_root',
        'inf_loss',
    ),
    'retinanet_coco': (
        osp.join(TINY, 'retinanet_r18_fpn_tiny-coco.py'),
        'tiny_coco_root',
        'inf_loss',
    ),
    'fcn_cityscapes': (
        osp.join(NANGUARD, 'fcn_r18-d8_nanguard_tiny-cityscapes.py'),
        'tiny_cityscapes_root',
        'inf_loss',
    ),
    'rotated_rtmdet_ema_dota': (
        osp.join(NANGUARD, 'rotated-rtmdet_tiny_nanguard_tiny-dota.py'),
        'tiny_dota_root',
        'inf_loss',
    ),
    'mask_rcnn_coco': (
        osp.join(TINY, 'mask-rcnn_r18_fpn_tiny-coco.py'),
        'tiny_coco_root',
        'inf_loss',
    ),
    's2anet_dota': (
        osp.join(TINY, 's2anet-le135_r18_fpn_tiny-dota.py'),
        'tiny_dota_root',
        'nan_grad',
    ),
    'r3det_dota': (
        osp.join(TINY, 'r3det-oc_r18_fpn_tiny-dota.py'),
        'tiny_dota_root',
        'inf_loss',
    ),
    'ocrnet_cityscapes': (
        osp.join(TINY, 'ocrnet_r18-d8_tiny-cityscapes.py'),
        'tiny_cityscapes_root',
        'nan_grad',
    ),
}

NOT_DIAGNOSED = ('s2anet_dota', 'r3det_dota', 'ocrnet_cityscapes')


class ParamRecorder(Hook):
    """Keeps a copy of the parameters after every training iteration."""

    priority = 'LOWEST'

    def __init__(self) -> None:
        self.after: List[Dict[str, Any]] = []

    def after_train_iter(
        self, runner, batch_idx, data_batch=None, outputs=None
    ):
        self.after.append(
            {
                name: p.detach().clone()
                for name, p in runner.model.named_parameters()
            }
        )


def family_cfg(
    config: str,
    work_dir: str,
    data_root: str,
    max_iters: int,
    fault: str = 'inf_loss',
    **overrides,
) -> Config:
    """The family's config with ``fault`` planted at iteration 1, for
    ``max_iters`` iterations."""
    cfg = load_tiny_config(config, work_dir, data_root, max_iters=max_iters)
    cfg.custom_hooks = list(cfg.get('custom_hooks', [])) + [
        dict(type='FaultInjectionHook', fault=fault, iteration=FAULT_ITER)
    ]
    cfg.merge_from_dict(overrides)
    return cfg


def run_family(family: str, tmp_dir: str, data_root: str) -> Dict[str, Any]:
    """Train ``family`` for :data:`MAX_ITERS` iterations under ``tmp_dir``.

    Returns:
        dict: ``family``, ``config``, ``data_root``, ``fault``,
        ``work_dir``, ``checkpoint`` and ``incident`` (paths), the trained
        ``runner`` and ``params_after`` (the parameters after each
        iteration).
    """
    config, _, fault = RUNS[family]
    if osp.dirname(config) == TINY:  # add the include, as a user does
        base, config = config, osp.join(tmp_dir, f'{family}_nanguard.py')
        with open(config, 'w') as f:
            f.write(f"_base_ = [{base!r}, 'mmnanguard::_base_/nanguard.py']\n")
    work_dir = osp.join(tmp_dir, 'work')
    cfg = family_cfg(config, work_dir, data_root, MAX_ITERS, fault)
    if family in NOT_DIAGNOSED:
        for hook in cfg.nanguard.hooks:
            if hook['type'] == 'NanDiagnosisHook':
                hook['max_diagnoses'] = 0
    runner = RUNNERS.build(cfg)
    recorder = ParamRecorder()
    runner.register_hook(recorder)
    runner.train()
    (incident,) = glob.glob(osp.join(work_dir, 'nanguard', 'incident_*'))
    return dict(
        family=family,
        config=config,
        data_root=data_root,
        fault=fault,
        work_dir=work_dir,
        checkpoint=osp.join(work_dir, f'iter_{MAX_ITERS}.pth'),
        incident=incident,
        runner=runner,
        params_after=recorder.after,
    )


@pytest.fixture(scope='session')
def family_runs(request, tmp_path_factory):
    """``family_runs(family)``: that family's run (made on first use)."""
    done = {}

    def get(family):
        if family not in done:
            data_root = request.getfixturevalue(RUNS[family][1])
            tmp_dir = str(tmp_path_factory.mktemp(family))
            done[family] = run_family(family, tmp_dir, data_root)
        return done[family]

    return get
