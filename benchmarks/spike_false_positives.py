# Copyright (c) mmnanguard contributors. All rights reserved.
"""False-positive count of the loss-spike detector on a healthy real run.

Trains the tiny rotated RetinaNet DOTA config (ResNet-18, generated data)
for ``--iters`` iterations with ``NanGuardHook(spike=dict(action='log'))``
and reports

* the detector's own count (``nanguard_spikes``) at the default settings;
* every quantity's largest ratio ``value / running max`` past warmup: the
  margin below the threshold factor;
* the counts a replay of the recorded series gives for other factors.

Usage::

    python benchmarks/spike_false_positives.py --iters 200 [--json out]

About 0.35 s per iteration on 2 CPU cores (200 iterations: ~75 s).
"""

import argparse
import json
import math
import tempfile
from typing import Dict, List

import torch
from mmengine.hooks import Hook
from mmengine.runner import Runner

import mmnanguard  # noqa: F401
from mmnanguard.datagen import generate_dota
from mmnanguard.engine.guard import SpikeDetector, SpikeSettings
from mmnanguard.engine.hooks import NanGuardHook
from mmnanguard.testing import TINY_DOTA_CONFIG, load_tiny_config


class SeriesRecorder(Hook):
    """The values the detector saw, per iteration."""

    priority = 'LOWEST'

    def __init__(self) -> None:
        self.series: List[Dict[str, float]] = []
        self.lrs: List[float] = []

    def after_train_iter(
        self, runner, batch_idx, data_batch=None, outputs=None
    ) -> None:
        guard = next(h for h in runner.hooks if isinstance(h, NanGuardHook))
        verdict = guard.step_guard.outcome.last
        if verdict is None:
            return
        values = {k: v for k, v in verdict.loss_terms.items() if 'loss' in k}
        values['grad_norm'] = verdict.grad_norm
        self.series.append(values)
        self.lrs.append(runner.optim_wrapper.get_lr()['lr'][0])


def replay(series: List[Dict[str, float]], factor: float) -> List[int]:
    """Iterations a detector with ``factor`` flags on the recorded series
    (identical to the online detector under ``action='log'``)."""
    detector = SpikeDetector(SpikeSettings(action='log', factor=factor))
    flagged = []
    for i, values in enumerate(series):
        check = detector.check(
            {k: torch.tensor(v) for k, v in values.items() if v is not None}
        )
        if check is not None and bool(check.flags.any()):
            flagged.append(i)
    return flagged


def max_ratios(series: List[Dict[str, float]]) -> Dict[str, float]:
    """Largest ``value / max(previous window)`` past warmup per quantity,
    with the default window and warmup."""
    s = SpikeSettings()
    ratios: Dict[str, float] = {}
    history: Dict[str, List[float]] = {}
    for values in series:
        for k, v in values.items():
            if v is None or not math.isfinite(v):
                continue
            past = history.setdefault(k, [])
            if len(past) >= s.warmup and max(past[-s.window :]) > 0:
                ratio = v / max(past[-s.window :])
                ratios[k] = max(ratios.get(k, 0.0), ratio)
            past.append(v)
    return ratios


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--iters', type=int, default=200)
    parser.add_argument(
        '--schedule',
        choices=('config', 'warmup'),
        default='config',
        help='config: the tiny config as shipped (its MultiStepLR epoch '
        'milestones 8 and 11 become iterations 8 and 11, lr / 100 from '
        'there); warmup: its LinearLR warmup only (lr rising to 0.01)',
    )
    parser.add_argument('--json', help='write the figures to this file')
    args = parser.parse_args()
    root = tempfile.mkdtemp(prefix='spike_fp_')
    generate_dota(f'{root}/data', num_images=8, seed=0)
    cfg = load_tiny_config(
        TINY_DOTA_CONFIG,
        f'{root}/work',
        f'{root}/data',
        max_iters=args.iters,
        custom_hooks=[dict(type='NanGuardHook', spike=dict(action='log'))],
    )
    cfg.merge_from_dict(
        {
            'train_dataloader.sampler': dict(type='InfiniteSampler'),
            'default_hooks.logger.interval': 50,
        }
    )
    if args.schedule == 'warmup':
        cfg.param_scheduler = [
            s for s in cfg.param_scheduler if s.type == 'LinearLR'
        ]
    runner = Runner.from_cfg(cfg)
    recorder = SeriesRecorder()
    runner.register_hook(recorder)
    runner.train()
    guard = next(h for h in runner.hooks if isinstance(h, NanGuardHook))
    result = dict(
        iterations=args.iters,
        schedule=args.schedule,
        lr_range=[min(recorder.lrs), max(recorder.lrs)],
        detections_default_factor_10=guard.counters['spikes'],
        incidents=guard.counters['incidents'],
        max_ratio_to_running_max=max_ratios(recorder.series),
        replay_flagged_iterations={
            str(f): replay(recorder.series, f) for f in (2.0, 3.0, 5.0, 10.0)
        },
    )
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(result, f, indent=2)


if __name__ == '__main__':
    main()
