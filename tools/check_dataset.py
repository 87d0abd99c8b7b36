# Copyright (c) mmnanguard contributors. All rights reserved.
"""Scan a dataset through its config's dataset and pipeline for annotations
that turn into NaN: degenerate or non-finite boxes, angles on the boundary,
labels outside the vocabulary, stray segmentation values, and, when the
model has a CTC loss, text labels it cannot align to the recognizer's
output (each sample through the pipeline and the model's loss forward).

Usage::

    python tools/check_dataset.py CONFIG [--split train|val|test]
        [--augment-repeats R] [--out report.json] [--cfg-options K=V ...]

Exit code: 0 without problems, 1 with problems, 2 for a bad invocation
(missing config, a split the config has no dataloader for).
"""

import argparse
import json
import sys
from typing import List, Optional

import mmnanguard  # noqa: F401  (stack mends before mmrotate is imported)
from mmnanguard.analysis.cli import KeyValueAction, load_config, usage_error
from mmnanguard.analysis.ctc_dataset_check import CtcAlignmentCheck
from mmnanguard.datasets.scan import DatasetScan, format_report
from mmnanguard.optional import MissingPackageError

PROG = 'tools/check_dataset.py'


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Check a dataset for annotations that cause NaN'
    )
    parser.add_argument('config', help='train config file path')
    parser.add_argument(
        '--split',
        default='train',
        choices=['train', 'val', 'test'],
        help='which dataloader of the config to scan (default: train)',
    )
    parser.add_argument(
        '--augment-repeats',
        type=int,
        default=0,
        metavar='R',
        help='also run the full pipeline R times per sample (default: 0, '
        'loading only)',
    )
    parser.add_argument(
        '--min-size',
        type=float,
        default=1.0,
        help='minimal box side in pixels (default: 1)',
    )
    parser.add_argument(
        '--seed', type=int, default=0, help='seed of the augmentation runs'
    )
    parser.add_argument('--out', help='write the full report as JSON')
    parser.add_argument(
        '--max-rows',
        type=int,
        default=100,
        help='most problem rows printed (default: 100)',
    )
    parser.add_argument(
        '--no-progress', action='store_true', help='hide the progress bar'
    )
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=KeyValueAction,
        help='override settings of the config, as in tools/train.py',
    )
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    cfg, error = load_config(args.config, args.cfg_options)
    if cfg is None:
        return usage_error(PROG, error)
    try:
        ctc, ctc_unknown = CtcAlignmentCheck.from_config(cfg)
        scan = DatasetScan(
            cfg,
            split=args.split,
            augment_repeats=args.augment_repeats,
            min_size=args.min_size,
            seed=args.seed,
            sample_checks=[ctc] if ctc is not None else [],
        )
    except (ValueError, FileNotFoundError, MissingPackageError) as err:
        return usage_error(PROG, str(err))
    if ctc_unknown:
        scan.not_checked.append(ctc_unknown)
    report = scan.run(progress=not args.no_progress)
    report['config'] = args.config
    print(format_report(report, max_rows=args.max_rows))
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(report, f, indent=2)
        print(f'report written to {args.out}')
    return 1 if report['problems'] else 0


if __name__ == '__main__':
    sys.exit(main())
