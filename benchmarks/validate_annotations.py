# Copyright (c) mmnanguard contributors. All rights reserved.
"""Cost of annotation validation.

1. ``ValidateAnnotations``' share of data-loading time: the tiny DOTA
   config's full train pipeline with and without the transform, on the same
   generated set, interleaved sample by sample in one run (A/B order
   alternates). Two figures per round: the direct share (time inside the
   transform / time of the whole pipeline, both measured in the B runs) and
   the A/B difference ``(t_B - t_A) / t_B``. Median and min..max over
   rounds. Target: 5% or less.
2. ``tools/check_dataset.py`` loading-only throughput on a generated DOTA
   set with ~70 instances per image, and the projected time for DOTA-v1.0
   train (1,411 images, ~98,000 instances).

Usage::

    python benchmarks/validate_annotations.py [--rounds 7] [--out b.json]
"""

import argparse
import copy
import json
import os.path as osp
import statistics
import tempfile
import time
from typing import Any, Dict, List

import numpy as np
from mmengine.logging import MMLogger
from mmengine.registry import DATASETS, init_default_scope

import mmnanguard  # noqa: F401  (stack mends first)
from mmnanguard.datagen import generate_dota
from mmnanguard.datasets.scan import DatasetScan
from mmnanguard.testing import TINY_DOTA_CONFIG, load_tiny_config

DOTA_TRAIN_IMAGES = 1411
DOTA_TRAIN_INSTANCES = 98000


def build(cfg, validate: bool):
    ds_cfg = copy.deepcopy(cfg.train_dataloader.dataset)
    pipeline = copy.deepcopy(cfg.train_pipeline)
    if validate:
        pipeline.insert(
            len(pipeline) - 1,
            dict(
                type='ValidateAnnotations',
                num_classes=15,
                angle_version='le90',
            ),
        )
    ds_cfg.pipeline = pipeline
    return DATASETS.build(ds_cfg)


def run_sample(dataset, idx: int, seed: int) -> Dict[str, float]:
    """Time each transform of the pipeline on one sample."""
    np.random.seed(seed)
    times: Dict[str, float] = {}
    start = time.perf_counter()
    results = dataset.get_data_info(idx)
    for transform in dataset.pipeline.transforms:
        t0 = time.perf_counter()
        results = transform(results)
        times[type(transform).__name__] = time.perf_counter() - t0
    times['total'] = time.perf_counter() - start
    return times


def overhead(
    root: str, work: str, rounds: int, img_size: int = 256
) -> Dict[str, Any]:
    cfg = load_tiny_config(TINY_DOTA_CONFIG, work, root)
    cfg.train_dataloader.dataset.img_shape = (img_size, img_size)
    init_default_scope(cfg.default_scope)
    plain, checked = build(cfg, False), build(cfg, True)
    num = len(plain)
    for idx in range(num):  # warm-up (imports, caches)
        run_sample(plain, idx, idx)
        run_sample(checked, idx, idx)
    direct: List[float] = []
    ab: List[float] = []
    per_sample_us: List[float] = []
    sum_a = sum_b = 0.0
    for r in range(rounds):
        t_a = t_b = t_v = 0.0
        for idx in range(num):
            seed = r * num + idx
            order = (
                (plain, checked) if (r + idx) % 2 == 0 else (checked, plain)
            )
            for dataset in order:
                times = run_sample(dataset, idx, seed)
                if dataset is plain:
                    t_a += times['total']
                else:
                    t_b += times['total']
                    t_v += times['ValidateAnnotations']
        direct.append(t_v / t_b)
        ab.append((t_b - t_a) / t_b)
        per_sample_us.append(1e6 * t_v / num)
        sum_a, sum_b = sum_a + t_a, sum_b + t_b
    return dict(
        samples=num,
        rounds=rounds,
        loading_ms_per_sample=1e3 * sum_b / (num * rounds),
        ab_share_pooled=(sum_b - sum_a) / sum_b,
        direct_share=summary(direct),
        ab_share=summary(ab),
        validate_us_per_sample=summary(per_sample_us),
    )


def summary(values: List[float]) -> Dict[str, float]:
    return dict(
        median=statistics.median(values), min=min(values), max=max(values)
    )


def scan_speed(root: str, work: str, img_size: int) -> Dict[str, Any]:
    cfg = load_tiny_config(TINY_DOTA_CONFIG, work, root)
    cfg.train_dataloader.dataset.img_shape = (img_size, img_size)
    scan = DatasetScan(cfg)
    report = scan.run(progress=False)
    ips = report['images_per_second']
    per_instance = report['num_instances'] / report['num_samples']
    return dict(
        img_size=img_size,
        images=report['num_samples'],
        instances_per_image=per_instance,
        problems=len(report['problems']),
        seconds=report['seconds'],
        images_per_second=ips,
        projected_dota_train_seconds=DOTA_TRAIN_IMAGES / ips,
        projected_dota_train_instances_per_image=(
            DOTA_TRAIN_INSTANCES / DOTA_TRAIN_IMAGES
        ),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--rounds', type=int, default=21)
    parser.add_argument('--scan-images', type=int, default=40)
    parser.add_argument('--out', help='write the figures as JSON')
    args = parser.parse_args()
    # the filter's per-sample warnings are not part of the measurement
    MMLogger.get_instance('validate_annotations_bench', log_level='ERROR')
    with tempfile.TemporaryDirectory() as tmp:
        tiny = osp.join(tmp, 'tiny')
        generate_dota(tiny, num_images=8, seed=0)
        result = dict(
            overhead=overhead(tiny, osp.join(tmp, 'w1'), args.rounds)
        )
        result['scan'] = []
        for img_size, num in (
            (1024, args.scan_images),
            (2048, max(4, args.scan_images // 4)),
        ):
            folder = osp.join(tmp, f'dense{img_size}')
            t0 = time.perf_counter()
            generate_dota(
                folder,
                num_images=num,
                img_size=img_size,
                objects_per_image=(60, 80),
                seed=1,
            )
            print(
                f'generated {num} {img_size} px images in '
                f'{time.perf_counter() - t0:.1f} s'
            )
            result['scan'].append(
                scan_speed(folder, osp.join(tmp, f'w{img_size}'), img_size)
            )
        dense = osp.join(tmp, 'dense1024')
        dense_rounds = max(3, args.rounds // 4)
        result['overhead_dense'] = overhead(
            dense, osp.join(tmp, 'w3'), dense_rounds, img_size=1024
        )
    for key, name in (
        ('overhead', 'tiny DOTA: 256 px, 2-5 instances'),
        ('overhead_dense', '1024 px, ~70 instances'),
    ):
        o = result[key]
        print(
            f'ValidateAnnotations share of data loading ({name}; '
            f"{o['samples']} samples x {o['rounds']} rounds, interleaved; "
            f"{o['loading_ms_per_sample']:.1f} ms per sample):"
        )
        for share in ('direct_share', 'ab_share'):
            v = o[share]
            print(
                f'  {share}: median {100 * v["median"]:.2f}% '
                f'(min {100 * v["min"]:.2f}%, max {100 * v["max"]:.2f}%)'
            )
        print(f"  ab_share_pooled: {100 * o['ab_share_pooled']:.2f}%")
        v = o['validate_us_per_sample']
        print(
            f'  transform time per sample: median {v["median"]:.0f} us '
            f'(min {v["min"]:.0f}, max {v["max"]:.0f})'
        )
    for s in result['scan']:
        print(
            f"check_dataset loading-only, {s['img_size']} px: {s['images']} "
            f"images x {s['instances_per_image']:.1f} instances, "
            f"{s['seconds']:.2f} s, {s['images_per_second']:.1f} images/s, "
            f"{s['problems']} problems"
        )
        print(
            f'  projected DOTA-v1.0 train ({DOTA_TRAIN_IMAGES} images, '
            f'~{DOTA_TRAIN_INSTANCES} instances) at this size: '
            f"{s['projected_dota_train_seconds']:.0f} s "
            f"({s['projected_dota_train_seconds'] / 60:.1f} min)"
        )
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(result, f, indent=2)


if __name__ == '__main__':
    main()
