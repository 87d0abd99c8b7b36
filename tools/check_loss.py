# Copyright (c) mmnanguard contributors. All rights reserved.
"""Stress-test the loss modules of a config (or one registered loss) with
a battery of adversarial inputs: empty inputs, saturated predictions,
degenerate boxes, out-of-range labels, fp16/bf16 autocast, weight and
reduction variants. Each case checks the value and, through a real
backward pass, the gradient. A failing module with a safe drop-in is
named with it, and the drop-in is run on the same cases.

Usage::

    python tools/check_loss.py CONFIG [--failures-only] [--json OUT]
    python tools/check_loss.py --loss TYPE [--scope mmdet]
        [--kwargs K=V ...] [--kind KIND] [--num-classes C]

Exit code: 0 every case passes, 1 a case fails, 2 a bad invocation (a
missing or broken config, an unknown type name).
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
    usage_error,
)
from mmnanguard.analysis.loss_battery import (
    KINDS,
    check_config_losses,
    check_loss_config,
    format_table,
)
from mmnanguard.config_walk import build_in_scope, unresolved_losses

EXIT_FAILED = 1
PROG = 'tools/check_loss.py'


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(
        description='Stress-test loss modules with adversarial inputs'
    )
    parser.add_argument(
        'config',
        nargs='?',
        help="config file path (or 'mmdet::retinanet/x.py')",
    )
    parser.add_argument(
        '--loss', metavar='TYPE', help='check one registered loss type'
    )
    parser.add_argument(
        '--kwargs',
        nargs='+',
        action=KeyValueAction,
        default={},
        metavar='K=V',
        help='arguments of --loss, e.g. loss_type=kld',
    )
    parser.add_argument(
        '--scope',
        default='mmdet',
        help='default scope to build --loss in (default: mmdet)',
    )
    parser.add_argument(
        '--kind',
        choices=KINDS,
        help='input kind of --loss (default: inferred)',
    )
    parser.add_argument('--num-classes', type=int, help='classes of --loss')
    parser.add_argument(
        '--angle-version', choices=['oc', 'le90', 'le135'], default=None
    )
    parser.add_argument('--ignore-index', type=int, default=None)
    parser.add_argument(
        '--failures-only', action='store_true', help='print failing cases only'
    )
    parser.add_argument('--json', metavar='OUT', help='write results as JSON')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=KeyValueAction,
        help='override settings of the config, as in tools/train.py',
    )
    args = parser.parse_args(argv)
    if (args.config is None) == (args.loss is None):
        parser.error('give either a CONFIG or --loss TYPE')
    return args


def _reports(args: argparse.Namespace):
    """The module reports, or an error message for a bad invocation."""
    if args.loss is not None:
        cfg = dict(args.kwargs, type=args.loss)
        try:
            build_in_scope(cfg, args.scope)
        except INPUT_ERRORS as err:
            return None, (
                f'cannot build --loss {args.loss!r} in scope '
                f'{args.scope!r} with {args.kwargs}: '
                f'{type(err).__name__}: {err}'
            )
        settings = dict(
            num_classes=args.num_classes,
            angle_version=args.angle_version,
            ignore_index=args.ignore_index,
        )
        try:
            report = check_loss_config(
                cfg, args.scope, args.loss, args.kind, **settings
            )
        except INPUT_ERRORS as err:
            return None, (
                f'cannot check --loss {args.loss!r} in scope '
                f'{args.scope!r} with {args.kwargs}: '
                f'{type(err).__name__}: {err}'
            )
        # a loss named on the command line must be exercised
        problem = report.error or report.skipped
        if problem and not report.results:
            return None, f'--loss {args.loss!r} with {args.kwargs}: {problem}'

        return [report], None
    cfg, error = load_config(args.config, args.cfg_options)
    if error is not None:
        return None, error
    try:
        reports = check_config_losses(cfg)
    except INPUT_ERRORS as err:
        return None, (
            f'invalid configuration {args.config!r}: '
            f'{type(err).__name__}: {err}'
        )
    for path, name in unresolved_losses(
        cfg.get('model') or {}, cfg.get('default_scope')
    ):
        print(
            f'note: {path}: type {name!r} is not registered in scope '
            f"{cfg.get('default_scope')!r}; not checked"
        )
    if not reports:
        return None, f'no loss module found in the model of {args.config!r}'
    return reports, None


def main(argv: Optional[List[str]] = None) -> int:
    """Run the battery; return the exit code (see the module docstring)."""
    args = parse_args(argv)
    reports, error = _reports(args)
    if error is not None:
        return usage_error(PROG, error)
    print(format_table(reports, failures_only=args.failures_only))
    if args.json:
        with open(args.json, 'w') as f:
            json.dump([r.to_dict() for r in reports], f, indent=2)
        print(f'results written to {args.json}')
    return EXIT_FAILED if any(not r.passed for r in reports) else 0


if __name__ == '__main__':
    sys.exit(main())
