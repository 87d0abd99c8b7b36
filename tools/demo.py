# Copyright (c) mmnanguard contributors. All rights reserved.
"""The README main job: guarded training of mmrotate's rotated RetinaNet on a
generated tiny DOTA set, with one injected numerical fault.

Usage: ``python tools/demo.py [--work-dir work_dirs/demo]``
"""
import argparse
import glob
import json
import os.path as osp
import sys

import mmnanguard  # noqa: F401  (stack mends before mmrotate)
from mmengine.runner import Runner

from mmnanguard.datagen import generate_dota
from mmnanguard.engine.hooks import NanGuardHook
from mmnanguard.testing import (TINY_DOTA_CONFIG, load_tiny_config,
                                tensors_all_finite)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--work-dir', default='work_dirs/demo')
    parser.add_argument('--iters', type=int, default=12)
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    data_root = osp.join(args.work_dir, 'data')
    generate_dota(data_root, num_images=8, seed=0)
    print(f'[demo] generated a tiny DOTA set in {data_root}')
    cfg = load_tiny_config(
        TINY_DOTA_CONFIG, args.work_dir, data_root, max_iters=args.iters,
        custom_hooks=[
            dict(type='FaultInjectionHook', fault='inf_loss', iteration=5),
            dict(type='NanGuardHook', policy='skip'),
        ])
    runner = Runner.from_cfg(cfg)
    runner.train()
    guard = next(h for h in runner.hooks if isinstance(h, NanGuardHook))
    finite = tensors_all_finite(runner.model.state_dict())
    print('\n[demo] ===== summary =====')
    for path in sorted(glob.glob(osp.join(args.work_dir, 'nanguard', '*',
                                          'report.json'))):
        report = json.load(open(path))
        print(f"[demo] detected {report['kind']} at iteration "
              f"{report['iteration']}: {report['nonfinite_terms']} -> "
              f"action {report['action']}; report: {path}")
    print(f'[demo] counters: {guard.counters}')
    print(f'[demo] training reached iteration {runner.iter}/{args.iters}; '
          f'weights finite: {finite}')
    return 0 if finite and runner.iter == args.iters else 1


if __name__ == '__main__':
    sys.exit(main())
