# Copyright (c) mmnanguard contributors. All rights reserved.
"""How long the two preflight tools take on the CPU.

1. ``tools/check_loss.py`` on mmrotate's whole rotated RetinaNet DOTA
   config (every loss module of the model, the full battery, the drop-in
   re-runs), and ``tools/doctor.py`` on upstream mmdet, mmrotate and mmseg
   configs: end to end, each run a fresh ``python tools/...`` process
   (imports of torch and the OpenMMLab stack included; the import alone
   is measured too, as ``python -c 'import mmnanguard, mmdet.models,
   mmrotate.models, mmseg.models'``).
2. The same work in one process once the stack is imported (what
   ``tools/train.py --smoke-test`` adds for the doctor, and what a user's
   ``assert_loss_stable`` costs in a test suite).

Median and min..max over ``--rounds`` runs.

Usage::

    python benchmarks/preflight_tools.py [--rounds 3] [--out b.json]
"""

import argparse
import json
import os
import os.path as osp
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List

from mmengine.config import Config

import mmnanguard  # noqa: F401  (stack mends first)
from mmnanguard.analysis.config_path import resolve_config_path
from mmnanguard.analysis.doctor import run_doctor
from mmnanguard.analysis.loss_battery import check_config_losses

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
CHECK_LOSS_CONFIGS = [
    'mmrotate::rotated_retinanet/'
    'rotated-retinanet-rbox-le90_r50_fpn_1x_dota.py',
]
DOCTOR_CONFIGS = [
    'mmrotate::rotated_retinanet/'
    'rotated-retinanet-rbox-le90_r50_fpn_1x_dota.py',
    'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py',
    'mmseg::fcn/fcn_r101-d8_4xb2-amp-80k_cityscapes-512x1024.py',
]


def _stats(times: List[float]) -> Dict[str, float]:
    return dict(
        median=statistics.median(times), min=min(times), max=max(times)
    )


def _timed(fn: Callable[[], object], rounds: int) -> Dict[str, float]:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return _stats(times)


IMPORT_ONLY = 'import mmnanguard, mmdet.models, mmrotate.models, mmseg.models'


def _process(*argv: str) -> Callable[[], None]:
    def run() -> None:
        subprocess.run(
            [sys.executable, *argv], cwd=REPO, capture_output=True, check=False
        )

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--out', help='write the figures as JSON')
    args = parser.parse_args()
    os.environ.setdefault('OMP_NUM_THREADS', '1')
    results = dict(rounds=args.rounds, process={}, in_process={})
    results['process']['import only'] = _timed(
        _process('-c', IMPORT_ONLY), args.rounds
    )
    for tool, configs in (
        ('check_loss.py', CHECK_LOSS_CONFIGS),
        ('doctor.py', DOCTOR_CONFIGS),
    ):
        for config in configs:
            key = f'{tool} {config}'
            results['process'][key] = _timed(
                _process(osp.join(REPO, 'tools', tool), config), args.rounds
            )
            cfg = Config.fromfile(resolve_config_path(config))
            work = (
                (lambda c=cfg: check_config_losses(c))
                if tool == 'check_loss.py'
                else (lambda c=cfg: run_doctor(c))
            )
            results['in_process'][key] = _timed(work, args.rounds)
    for mode in ('process', 'in_process'):
        print(f'{mode}:')
        for key, s in results[mode].items():
            print(
                f'  {key}: {s["median"]:.2f} s '
                f'({s["min"]:.2f}..{s["max"]:.2f})'
            )
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(results, f, indent=2)


if __name__ == '__main__':
    main()
