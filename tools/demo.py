# Copyright (c) mmnanguard contributors. All rights reserved.
"""The README main job (``make demo``).

1. Generates a tiny DOTA set and plants one broken annotation (a rotated
   box of width 0, which makes the box-regression loss infinite).
2. Trains mmrotate's rotated RetinaNet through ``tools/train.py`` with
   ``configs/demo/rotated-retinanet-rbox-le90_r18_nanguard-demo_tiny-dota.py``:
   the unmodified upstream config shrunk for the CPU, plus the
   ``mmnanguard::_base_/nanguard.py`` include, plus one injected numerical
   fault (a NaN gradient, ``FaultInjectionHook``: a test/drill helper
   that the config registers through ``custom_imports`` of
   ``mmnanguard.testing``).
3. Prints what was detected, the action taken, where each incident report
   is, and checks that the final checkpoint's weights are finite.

Usage: ``python tools/demo.py [--work-dir work_dirs/demo]`` (the work dir
is emptied first). Exit status 0 when training finished with finite weights
and both planted problems were detected.
"""

import argparse
import glob
import json
import os
import os.path as osp
import shutil
import subprocess
import sys
import time

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
CONFIG = osp.join(
    REPO,
    'configs',
    'demo',
    'rotated-retinanet-rbox-le90_r18_nanguard-demo_tiny-dota.py',
)
SHOWN = (
    'Epoch(train)',
    'NanGuard',
    'ValidateAnnotations',
    'failed for',
    'tools/train.py',
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--work-dir', default='work_dirs/demo')
    return parser.parse_args()


def say(msg: str) -> None:
    print(f'[demo] {msg}', flush=True)


def train(work_dir: str, data_root: str) -> int:
    """Run tools/train.py; echo the guard's lines, keep the full log."""
    cmd = [
        sys.executable,
        osp.join(REPO, 'tools', 'train.py'),
        CONFIG,
        '--work-dir',
        work_dir,
        '--cfg-options',
        f'train_dataloader.dataset.data_root={data_root}/',
    ]
    say(
        '$ '
        + ' '.join(osp.relpath(c) if c.startswith(REPO) else c for c in cmd)
    )
    log_path = osp.join(work_dir, 'train_stdout.log')
    with open(log_path, 'w') as log:
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for line in proc.stdout:
            log.write(line)
            if (
                any(key in line for key in SHOWN)
                and 'Warning' not in line
                and not line.startswith('(')
            ):
                text = line.rstrip()
                print(
                    '   | '
                    + (text[:200] + ' ...' if len(text) > 200 else text),
                    flush=True,
                )
        proc.wait()
    say(f'full training log: {log_path}')
    return proc.returncode


def summary(work_dir: str, planted: dict) -> bool:
    """Print detections, actions, reports and the final weights check."""
    from mmengine.runner.checkpoint import CheckpointLoader

    import mmnanguard  # noqa: F401  (checkpoint allowlist mend)
    from mmnanguard.testing import tensors_all_finite

    print()
    say('===== summary =====')
    say(
        f"planted: {planted['kind']} box in {planted['annfile']} line "
        f"{planted['line']}; injected: nan_grad at iteration 6"
    )
    reports = sorted(
        glob.glob(osp.join(work_dir, 'nanguard', '*', 'report.json'))
    )
    files_named, kinds = False, set()
    for path in reports:
        with open(path) as f:
            report = json.load(f)
        samples = [
            osp.basename(s.get('img_path') or '?')
            for s in report.get('samples', [])
        ]
        files_named |= osp.basename(planted['image']) in samples
        kinds.add(report['kind'])
        say(
            f"detected {report['kind']} at iteration {report['iteration']} "
            f"(non-finite terms {report['nonfinite_terms']}, grad_norm "
            f"{report['grad_norm']}) in batch {samples} -> action "
            f"{report['action']}"
        )
        verdict = (report.get('diagnosis') or {}).get('verdict') or []
        for line in verdict:
            say(f'  {line}')
        if verdict:
            say(f"  diagnosis: {osp.join(osp.dirname(path), 'report.md')}")
        say(f'  report: {path}')
    last = osp.join(work_dir, 'last_checkpoint')
    ckpt_path = open(last).read().strip() if osp.isfile(last) else None
    finite = False
    if ckpt_path and osp.isfile(ckpt_path):
        ckpt = CheckpointLoader.load_checkpoint(ckpt_path, map_location='cpu')
        finite = tensors_all_finite(ckpt['state_dict'])
        counters = ckpt.get('nanguard', {}).get('counters')
        say(
            f"training finished at iteration {ckpt['meta']['iter']}; final "
            f'checkpoint {ckpt_path}: all weights finite = {finite}'
        )
        say(f'guard counters: {counters}')
    else:
        say('no final checkpoint was written')
    ok = (
        finite
        and files_named
        and kinds == {'nonfinite_loss', 'nonfinite_grad'}
    )
    say(
        'OK: both planted problems detected, skipped, reported; weights '
        'finite'
        if ok
        else 'FAILED: see the log above'
    )
    return ok


def main() -> int:
    args = parse_args()
    start = time.time()
    work_dir = osp.abspath(args.work_dir)
    if osp.isdir(work_dir):
        shutil.rmtree(work_dir)
    os.makedirs(work_dir)
    from mmnanguard.datagen import generate_dota

    data_root = osp.join(work_dir, 'data')
    written = generate_dota(
        data_root, num_images=8, seed=0, broken=['zero_width']
    )
    planted = written['broken'][0]
    say(f'generated a tiny DOTA set (8 images) in {data_root}')
    say(
        f"planted a broken annotation: {planted['kind']} in "
        f"{planted['annfile']} line {planted['line']}"
    )
    code = train(work_dir, data_root)
    if code != 0:
        say(f'tools/train.py exited with status {code}')
    ok = summary(work_dir, planted) and code == 0
    say(f'wall time {time.time() - start:.0f} s')
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
