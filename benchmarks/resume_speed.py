# Copyright (c) mmnanguard contributors. All rights reserved.
"""Time from ``runner.train()`` of a resumed run to its first trained
iteration, at an early and at a late iteration, protected and bare.

The tiny FCN (the upstream mmseg Cityscapes config, shrunk:
``InfiniteSampler``, ``IterBasedTrainLoop``, ``RandomResize``, ``RandomCrop``,
``RandomFlip``) on a generated Cityscapes folder of PNG images on disk
(``--img-size``, default 1024x512). Each mode trains 2 iterations and saves
``iter_2.pth``; that checkpoint, relabelled as iteration N (``meta.iter``; the
loop's position is all that differs), is resumed with ``max_iters = N + 1``,
and the time from ``runner.train()`` to the first ``before_train_iter`` is
taken. The resumes are interleaved over ``--rounds``.

* ``include`` (the protected run): the sampler is advanced by N batches of
  indices, nothing is loaded (:mod:`mmnanguard.engine.resume`).
* ``bare`` (mmengine 0.10.7): ``IterBasedTrainLoop`` loads and transforms
  N batches (``next(iterator)`` N times); its late N is ``--bare-late``
  (default 1,000), and the report gives its cost per trained iteration.

Usage::

    python benchmarks/resume_speed.py --rounds 3 --out resume_speed.json
"""

import argparse
import json
import os.path as osp
import statistics
import sys
import tempfile
import time
import uuid
from typing import Any, Dict, List

import torch

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
CONFIGS = {
    'include': osp.join(
        REPO, 'configs', 'nanguard', 'fcn_r18-d8_nanguard_tiny-cityscapes.py'
    ),
    'bare': osp.join(REPO, 'configs', 'tiny', 'fcn_r18-d8_tiny-cityscapes.py'),
}


def _config(mode: str, work_dir: str, data_root: str, max_iters: int):
    from mmengine.config import Config

    cfg = Config.fromfile(CONFIGS[mode])
    cfg.work_dir = work_dir
    cfg.experiment_name = f'{mode}_{uuid.uuid4().hex[:8]}'
    cfg.train_dataloader.dataset.data_root = osp.join(data_root, '')
    cfg.train_cfg.max_iters = max_iters
    cfg.default_hooks.checkpoint = dict(
        type='CheckpointHook', interval=10**9, by_epoch=False
    )
    return cfg


class FirstIteration:
    """Record the time of the first ``before_train_iter``."""

    def __init__(self) -> None:
        from mmengine.hooks import Hook

        outer = self

        class Probe(Hook):
            priority = 'HIGHEST'

            def before_train_iter(self, runner, batch_idx, data_batch=None):
                if outer.at is None:
                    outer.at = time.perf_counter()

        self.at = None
        self.hook = Probe()


def _trained_checkpoint(mode: str, folder: str, data_root: str) -> str:
    from mmengine.registry import RUNNERS

    cfg = _config(mode, osp.join(folder, f'{mode}_start'), data_root, 2)
    cfg.default_hooks.checkpoint.interval = 2
    RUNNERS.build(cfg).train()
    return osp.join(cfg.work_dir, 'iter_2.pth')


def _relabelled(path: str, iteration: int, folder: str) -> str:
    checkpoint = torch.load(path, map_location='cpu', weights_only=False)
    checkpoint['meta']['iter'] = iteration
    out = osp.join(folder, f'iter_{iteration}.pth')
    torch.save(checkpoint, out)
    return out


def resume_time(
    mode: str, checkpoint: str, iteration: int, folder: str, data_root: str
) -> float:
    """Seconds from ``train()`` to the first trained iteration."""
    from mmengine.registry import RUNNERS

    work_dir = osp.join(folder, f'{mode}_{iteration}_{uuid.uuid4().hex[:6]}')
    cfg = _config(mode, work_dir, data_root, iteration + 1)
    cfg.load_from, cfg.resume = checkpoint, True
    runner = RUNNERS.build(cfg)
    probe = FirstIteration()
    runner.register_hook(probe.hook, 'HIGHEST')
    start = time.perf_counter()
    runner.train()
    assert runner.iter == iteration + 1, runner.iter
    return probe.at - start


def main(argv: List[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--early', type=int, default=10)
    parser.add_argument('--late', type=int, default=10_000)
    parser.add_argument('--bare-late', type=int, default=1_000)
    parser.add_argument('--images', type=int, default=16)
    parser.add_argument('--img-size', type=int, nargs=2, default=[1024, 512])
    parser.add_argument('--out', default=None)
    args = parser.parse_args(argv)

    import mmnanguard  # noqa: F401  (registers the protected runner)
    from mmnanguard.datagen.cityscapes import generate_cityscapes

    folder = tempfile.mkdtemp(prefix='resume_speed_')
    data_root = osp.join(folder, 'data')
    generate_cityscapes(
        data_root, num_images=args.images, img_size=tuple(args.img_size)
    )
    cases = [
        ('include', args.early),
        ('include', args.late),
        ('bare', args.early),
        ('bare', args.bare_late),
    ]
    checkpoints: Dict[Any, str] = {}
    for mode in ('include', 'bare'):
        start = _trained_checkpoint(mode, folder, data_root)
        for case_mode, iteration in cases:
            if case_mode == mode:
                checkpoints[mode, iteration] = _relabelled(
                    start, iteration, osp.join(folder, f'{mode}_start')
                )
    times: Dict[str, List[float]] = {f'{m}@{n}': [] for m, n in cases}
    for round_ in range(args.rounds):
        order = cases[round_ % len(cases) :] + cases[: round_ % len(cases)]
        for mode, iteration in order:
            seconds = resume_time(
                mode,
                checkpoints[mode, iteration],
                iteration,
                folder,
                data_root,
            )
            times[f'{mode}@{iteration}'].append(seconds)
    median = {k: statistics.median(v) for k, v in times.items()}
    ratio = {
        'include': [
            late / early
            for early, late in zip(
                times[f'include@{args.early}'], times[f'include@{args.late}']
            )
        ],
        'bare': [
            late / early
            for early, late in zip(
                times[f'bare@{args.early}'], times[f'bare@{args.bare_late}']
            )
        ],
    }
    bare_per_iter = (
        median[f'bare@{args.bare_late}'] - median[f'bare@{args.early}']
    ) / (args.bare_late - args.early)
    report = dict(
        img_size=args.img_size,
        rounds=args.rounds,
        seconds=times,
        median_seconds=median,
        late_over_early=dict(
            (mode, dict(median=statistics.median(r), min=min(r), max=max(r)))
            for mode, r in ratio.items()
        ),
        bare_seconds_per_trained_iteration=bare_per_iter,
        bare_estimate_at_late=median[f'bare@{args.early}']
        + bare_per_iter * (args.late - args.early),
        device='cpu',
        torch=torch.__version__,
    )
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        with open(args.out, 'w') as f:
            f.write(text + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
