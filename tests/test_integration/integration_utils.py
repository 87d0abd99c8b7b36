# Copyright (c) mmnanguard contributors. All rights reserved.
"""Paths and helpers shared by the end-to-end tests."""

import os
import os.path as osp
import subprocess
import sys
from typing import List

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
TRAIN = osp.join(REPO, 'tools', 'train.py')
NANGUARD_DOTA = osp.join(
    REPO,
    'configs',
    'nanguard',
    'rotated-retinanet-rbox-le90_r18_nanguard_tiny-dota.py',
)
NANGUARD_RTMDET = osp.join(
    REPO, 'configs', 'nanguard', 'rotated-rtmdet_tiny_nanguard_tiny-dota.py'
)
NANGUARD_CITYSCAPES = osp.join(
    REPO, 'configs', 'nanguard', 'fcn_r18-d8_nanguard_tiny-cityscapes.py'
)
DEMO_CONFIG = osp.join(
    REPO,
    'configs',
    'demo',
    'rotated-retinanet-rbox-le90_r18_nanguard-demo_tiny-dota.py',
)


def run_script(
    args: List[str], timeout: int = 240, **kwargs
) -> subprocess.CompletedProcess:
    """Run ``python ARGS`` from the repo root; output captured as text."""
    env = dict(os.environ, PYTHONWARNINGS='ignore')
    env.update(kwargs.pop('env', {}))
    return subprocess.run(
        [sys.executable] + args,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,
    )


def data_options(root: str, images: int = 8) -> List[str]:
    """``--cfg-options`` values pointing a tiny DOTA config at ``root``,
    restricted to its first ``images`` images (one epoch = images/2)."""
    return [
        f'train_dataloader.dataset.data_root={root}/',
        f'train_dataloader.dataset.indices={images}',
    ]
