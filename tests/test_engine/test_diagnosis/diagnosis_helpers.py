# Copyright (c) mmnanguard contributors. All rights reserved.
"""Train the tiny rotated RetinaNet until an incident, diagnosed."""

import glob
import json
import os.path as osp
from typing import Any, Dict, List, Optional

from mmengine.runner import Runner

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
    return runner, read_reports(work_dir)


def read_reports(work_dir: str) -> List[Dict[str, Any]]:
    """Every ``report.json`` under ``work_dir/nanguard``, oldest first, with
    ``folder`` and (when written) the text of ``report.md`` as
    ``markdown``."""
    reports = []
    for path in sorted(
        glob.glob(osp.join(work_dir, 'nanguard', '*', 'report.json'))
    ):
        with open(path) as f:
            report = json.load(f)
        report['folder'] = osp.dirname(path)
        markdown = osp.join(report['folder'], 'report.md')
        if osp.isfile(markdown):
            with open(markdown) as f:
                report['markdown'] = f.read()
        reports.append(report)
    return reports
