# Copyright (c) mmnanguard contributors. All rights reserved.
"""Train the tiny rotated RetinaNet until an incident, diagnosed."""

import glob
import json
import os.path as osp
from typing import Any, Dict, List, Optional

import pytest
from mmengine.runner import Runner

from mmnanguard.datagen import generate_dota
from mmnanguard.engine import NonFiniteTrainingError
from mmnanguard.testing import TINY_DOTA_CONFIG, load_tiny_config


def train_until_incident(
    work_dir: str,
    data_root: str,
    hooks: List[Dict[str, Any]],
    max_iters: int,
    policy: str = 'raise',
    extra_hooks: Optional[list] = None,
    **overrides: Any,
):
    """Train with ``NanGuardHook(policy)`` and ``NanDiagnosisHook``.

    Returns:
        tuple: ``(runner, reports)``: the runner and every written
        ``report.json`` (with ``folder``), oldest first.
    """
    cfg = load_tiny_config(
        TINY_DOTA_CONFIG,
        work_dir,
        data_root,
        max_iters=max_iters,
        custom_hooks=hooks
        + [
            dict(type='NanGuardHook', policy=policy, snapshot_interval=1),
            dict(type='NanDiagnosisHook'),
        ],
        **overrides,
    )
    cfg.default_hooks.checkpoint = dict(
        type='CheckpointHook', interval=10**6, by_epoch=False
    )
    runner = Runner.from_cfg(cfg)
    for hook in extra_hooks or []:
        runner.register_hook(hook, priority='LOWEST')
    try:
        runner.train()
    except NonFiniteTrainingError:
        pass
    reports = []
    for path in sorted(
        glob.glob(osp.join(work_dir, 'nanguard', '*', 'report.json'))
    ):
        with open(path) as f:
            report = json.load(f)
        report['folder'] = osp.dirname(path)
        reports.append(report)
    return runner, reports


@pytest.fixture(scope='session')
def zero_width_dota(tmp_path_factory):
    """4 DOTA images; ``P0000.txt`` line 2 is a rotated box of width 0."""
    root = str(tmp_path_factory.mktemp('zero_width_dota'))
    written = generate_dota(root, num_images=4, seed=0, broken=['zero_width'])
    return root, written['broken'][0]
