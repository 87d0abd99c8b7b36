# Copyright (c) mmnanguard contributors. All rights reserved.
"""Report the settings of a config that practitioners' checklists link to
NaNs, each with a severity and a one-line fix in config syntax: the lr
against the linear-scaling rule, warmup, SGD without ``clip_grad``, AMP
with a static loss scale / a small Adam ``eps`` / a loss with no fp32
island, loss weights outside [0.1, 10], BatchNorm ``eps`` at a per-GPU
batch of 1-2, 255 in segmentation labels without ``ignore_index=255``,
fragile modules with a safe drop-in, images without boxes kept for a
dense head that cannot take them, resuming AMP without GradScaler state.
Nothing heavy is built (the losses; a dense head alone, on random
features, when empty images are kept; label maps of a few samples are
read).

Usage::

    python tools/doctor.py CONFIG [--gpus N] [--json OUT]
        [--label-samples K] [--cfg-options K=V ...]

Exit code: 0 no error-level finding, 1 an error-level finding, 2 a bad
invocation (a missing or broken config).
"""

import argparse
import json
import sys
from typing import List, Optional

import mmnanguard  # noqa: F401  (stack mends before mmrotate is imported)
from mmnanguard.analysis.cli import (
    INPUT_ERRORS,
    KeyValueAction,
    load_config,
    positive_int,
    usage_error,
)
from mmnanguard.analysis.doctor import format_findings, run_doctor

EXIT_ERROR = 1
PROG = 'tools/doctor.py'


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(
        description='Report config settings linked to NaNs'
    )
    parser.add_argument(
        'config', help="config file path (or 'mmdet::retinanet/x.py')"
    )
    parser.add_argument(
        '--gpus',
        type=positive_int,
        default=1,
        help='number of GPUs (processes) training runs on (default: 1)',
    )
    parser.add_argument(
        '--label-samples',
        type=positive_int,
        default=4,
        help='segmentation label maps to read (default: 4)',
    )
    parser.add_argument('--json', metavar='OUT', help='write findings as JSON')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=KeyValueAction,
        help='override settings of the config, as in tools/train.py',
    )
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    """Run the doctor; return the exit code (see the module docstring)."""
    args = parse_args(argv)
    cfg, error = load_config(args.config, args.cfg_options)
    if error is not None:
        return usage_error(PROG, error)
    try:
        findings = run_doctor(
            cfg, num_gpus=args.gpus, label_samples=args.label_samples
        )
    except INPUT_ERRORS as err:
        return usage_error(
            PROG,
            f'invalid configuration {args.config!r}: '
            f'{type(err).__name__}: {err}',
        )
    print(format_findings(findings))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(
                dict(
                    config=args.config,
                    findings=[x.to_dict() for x in findings],
                ),
                f,
                indent=2,
            )
        print(f'findings written to {args.json}')
    return EXIT_ERROR if any(f.severity == 'error' for f in findings) else 0


if __name__ == '__main__':
    sys.exit(main())
