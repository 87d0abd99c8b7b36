# Copyright (c) mmnanguard contributors. All rights reserved.
"""Crash survival: what a kill, a full disk or a preemption leaves of a run,
bare mmengine (``tools/train.py --guard off``) against a protected run
(``--guard skip``).

Every trial of ``benchmarks/crash_trial.py`` (kills inside the checkpoint
save and inside the ``last_checkpoint`` write, with and without
``max_keep_ckpts=1``, ``ENOSPC`` from those writes, SIGTERM, a truncated
newest checkpoint, an empty ``last_checkpoint``) runs once per mode on the
tiny rotated RetinaNet (generated DOTA data, a checkpoint every
iteration, break at iteration 3), then ``tools/train.py --resume``. A
trial is survived when the resume exits 0, continues from the newest
state that had completed before the break (or a newer complete one), its
weights equal that checkpoint's, and no checkpoint that had completed
(and that ``max_keep_ckpts`` keeps) is lost.

Usage::

    python benchmarks/crash_survival.py --out benchmarks/crash_survival.json
    python benchmarks/crash_survival.py --trials sigterm truncated_newest
"""

import argparse
import json
import os.path as osp
import platform
import sys
import tempfile
import time
from typing import Dict, List, Optional

from crash_trial import BREAK_AT, TRIALS, TrialResult, run_trial

#: (column title, --guard value)
MODES = (('bare mmengine (--guard off)', 'off'), ('--guard skip', 'skip'))


def format_table(results: Dict[str, Dict[str, TrialResult]]) -> str:
    """A Markdown table: one row per trial, one outcome column per mode."""
    header = ['trial'] + [title for title, _ in MODES]
    lines = [
        '| ' + ' | '.join(header) + ' |',
        '|' + '---|' * len(header),
    ]
    for trial, by_mode in results.items():
        cells = [f'`{trial}`']
        for _, guard in MODES:
            result = by_mode[guard]
            mark = 'survives' if result.survived else '**lost**'
            cells.append(f'{mark}: {result.outcome()}')
        lines.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    """Run the trials, print the table, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument(
        '--trials', nargs='+', choices=sorted(TRIALS), default=list(TRIALS)
    )
    parser.add_argument('--out', help='JSON file to write')
    parser.add_argument(
        '--narrow',
        action='store_true',
        help='ResNet-18 at a quarter width (6 MB checkpoints; faster)',
    )
    args = parser.parse_args(argv)

    from mmnanguard.datagen import generate_dota

    results: Dict[str, Dict[str, TrialResult]] = {}
    with tempfile.TemporaryDirectory(prefix='crash_survival_') as tmp:
        data_root = osp.join(tmp, 'data')
        generate_dota(data_root, num_images=8, seed=0)
        start = time.time()
        for trial in args.trials:
            results[trial] = {}
            for _, guard in MODES:
                folder = osp.join(tmp, f'{trial}_{guard}')
                result = run_trial(
                    trial, guard, folder, data_root, args.narrow
                )
                results[trial][guard] = result
                print(
                    f'{trial:30s} --guard {guard:4s} '
                    f'{"survives" if result.survived else "LOST":8s} '
                    f'{result.outcome()} ({result.seconds} s)',
                    flush=True,
                )
        seconds = round(time.time() - start, 1)
    table = format_table(results)
    print(table)
    if args.out:
        payload = dict(
            break_at=BREAK_AT,
            narrow=args.narrow,
            seconds=seconds,
            python=platform.python_version(),
            table=table,
            results={
                trial: {
                    guard: dict(
                        vars(result),
                        survived=result.survived,
                        outcome=result.outcome(),
                    )
                    for guard, result in by_mode.items()
                }
                for trial, by_mode in results.items()
            },
        )
        with open(args.out, 'w') as f:
            json.dump(payload, f, indent=1)
            f.write('\n')
    protected = [r['skip'].survived for r in results.values()]
    return 0 if all(protected) else 1


if __name__ == '__main__':
    sys.exit(main())
