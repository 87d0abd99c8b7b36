# Copyright (c) mmnanguard contributors. All rights reserved.
"""Fault matrix: which protection catches which numerical fault, and what
is left of the run.

Each cell trains a real tiny config (mmrotate rotated RetinaNet on DOTA,
mmdet RetinaNet on COCO; generated data) for ``--max-iters`` iterations,
with one fault planted at iteration ``--fault-iter`` and one protection
mode, with its own Runner and work dir. The cells of one (config, fault)
share a subprocess (one import of the stack); a cell that kills its
process is rerun alone in a fresh one, so a crash cannot kill the table.
``--jobs 2`` runs two such groups at once, one torch thread each.
Checkpoints every ``--ckpt-interval`` iterations. The sampler does not
shuffle, so a planted annotation reaches the model in iteration
``--fault-iter`` in every mode. The fp16 row trains 128 px images for at
most 4 iterations (fp16 convolutions are ~25x slower than fp32 on a CPU
without fp16 arithmetic).

Faults (see ``fault_matrix_cell.FAULTS``): a NaN pixel; a zero-width box
(rotated for DOTA, horizontal for COCO) in an annotation file; an inf loss
term; a NaN gradient with a finite loss; an lr spike to 1e12; a NaN in the
optimizer state; an fp16 overflow under CPU autocast (``CPUAmpOptimWrapper``
fp16, ``backbone.conv1`` weights x1e5: its fp16 output overflows, the fp32
one is normalised by the BatchNorm that follows); an annotation with a
coordinate written as ``nan``.

Modes: ``bare`` mmengine; mmdet's ``CheckInvalidLossHook(interval=1)``
(its default interval is 50); ``torch.autograd.set_detect_anomaly(True)``
around the run (detection: it raised); mmnanguard ``NanGuardHook`` with
``raise``, ``skip`` and ``rollback`` (default settings otherwise) plus
``add_full_protection`` (``AmpScaleMonitorHook``, ``ValidateAnnotations``
with policy ``raise`` under ``raise`` and ``warn`` otherwise) and
``NanDiagnosisHook`` where it is registered.

Per cell: detected, at which iteration relative to the fault, by what;
weights finite; every checkpoint on disk finite; reached ``max_iters``;
cause named correctly (the first incident report's ``cause``); wall time.

Usage::

    python benchmarks/fault_matrix.py --jobs 2 \
        --out benchmarks/fault_matrix.json \
        --png benchmarks/fault_matrix.png --markdown fault_matrix.md
    python benchmarks/fault_matrix.py --configs dota --faults inf_loss \
        --modes bare guard_skip        # a subset
"""

import argparse
import glob
import json
import os
import os.path as osp
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List

HERE = osp.dirname(osp.abspath(__file__))
REPO = osp.dirname(HERE)
sys.path[:0] = [HERE, REPO]

import torch  # noqa: E402
from fault_matrix_cell import FAULTS, MODES, OUTCOMES, run_cell  # noqa: E402

CONFIGS = ('dota', 'coco')
MODE_LABELS = dict(
    bare='bare',
    check_invalid_loss='CheckInvalidLoss',
    anomaly='detect_anomaly',
    guard_raise='guard raise',
    guard_skip='guard skip',
    guard_rollback='guard rollback',
)


def _plant_dota(root: str, kind: str, index: int) -> str:
    """Append a broken line of ``kind`` to the annfile that
    ``DOTADataset`` lists ``index``-th; return its image path."""
    from mmnanguard.datagen.dota import DOTA_CLASSES, broken_line

    ann_dir = osp.join(root, 'trainval', 'annfiles')
    # DOTADataset lists the annfiles with this very glob (unsorted)
    annfile = glob.glob(osp.join(ann_dir, '*.txt'))[index]
    with open(annfile, 'a') as f:
        f.write(broken_line(kind, 256, DOTA_CLASSES[0]) + '\n')
    name = osp.basename(annfile)[:-4] + '.png'
    return osp.join(root, 'trainval', 'images', name)


def _plant_coco(root: str, kind: str, index: int) -> str:
    """Add a broken annotation of ``kind`` to the ``index``-th image."""
    ann_file = osp.join(root, 'annotations', 'instances.json')
    with open(ann_file) as f:
        coco = json.load(f)
    image = coco['images'][index]
    bbox = dict(
        zero_width=[100.0, 100.0, 0.0, 30.0],
        nan_coordinate=[float('nan'), 100.0, 30.0, 16.0],
    )[kind]
    coco['annotations'].append(
        dict(
            id=len(coco['annotations']) + 1,
            image_id=image['id'],
            category_id=1,
            bbox=bbox,
            area=bbox[2] * bbox[3],
            iscrowd=0,
        )
    )
    with open(ann_file, 'w') as f:
        json.dump(coco, f)  # NaN is written as NaN, which json.load reads
    return osp.join(root, 'images', image['file_name'])


def prepare_data(
    root: str, configs, faults, fault_iter: int, batch_size: int = 2
) -> Dict[str, Dict[str, Any]]:
    """Generate the clean and the planted data sets.

    Returns:
        dict: ``{config: {fault or 'clean': (data_root, fault_image)}}``.
    """
    from mmnanguard.datagen import generate_coco, generate_dota

    out: Dict[str, Dict[str, Any]] = {}
    for config in configs:
        out[config] = {}
        kinds = ['clean'] + [f for f in faults if 'data' in FAULTS[f]]
        for kind in kinds:
            path = osp.join(root, f'{config}_{kind}')
            image = None
            if config == 'dota':
                generate_dota(path, num_images=8, seed=0)
                if kind != 'clean':
                    image = _plant_dota(
                        path, FAULTS[kind]['data'], fault_iter * batch_size
                    )
            else:
                generate_coco(path, num_images=8, seed=0)
                if kind != 'clean':
                    image = _plant_coco(
                        path, FAULTS[kind]['data'], fault_iter * batch_size
                    )
            out[config][kind] = (path, image)
    return out


def _cell_cmd(
    config: str, fault: str, modes: List[str], data, args, work_base: str
) -> List[str]:
    data_root, image = data[config].get(fault, data[config]['clean'])
    cmd = [
        sys.executable,
        __file__,
        '--cell',
        config,
        fault,
        *modes,
        '--data-root',
        data_root,
        '--work-dir',
        work_base,
        '--max-iters',
        str(args.max_iters),
        '--fault-iter',
        str(args.fault_iter),
        '--ckpt-interval',
        str(args.ckpt_interval),
    ]
    return cmd + (['--fault-image', image] if image else [])


def _spawn(cmd: List[str], log: str, timeout: int, threads: int = 0):
    env = dict(os.environ, PYTHONWARNINGS='ignore')
    if threads:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    with open(log, 'a') as f:
        try:
            return subprocess.run(
                cmd,
                stdout=f,
                stderr=subprocess.STDOUT,
                env=env,
                timeout=timeout,
            ).returncode
        except subprocess.TimeoutExpired:
            return 'timeout'


def run_group(
    config: str, fault: str, modes: List[str], data, args, scratch: str
) -> List[Dict[str, Any]]:
    """Run the cells of one (config, fault) in one fresh interpreter, each
    with its own Runner and work dir (this saves the import time of each
    cell). Cells that the process did not finish (a hard crash) are rerun
    one by one, each in its own interpreter; a cell that fails again is
    recorded as crashed with the log's tail."""
    work_base = tempfile.mkdtemp(prefix=f'{config}_{fault}_', dir=scratch)
    log = osp.join(work_base, 'group.log')
    _spawn(
        _cell_cmd(config, fault, modes, data, args, work_base),
        log,
        args.cell_timeout * len(modes),
        args.threads,
    )
    results = []
    for mode in modes:
        rc = None
        out = osp.join(work_base, mode, 'cell.json')
        if not osp.isfile(out):
            shutil.rmtree(osp.join(work_base, mode), ignore_errors=True)
            rc = _spawn(
                _cell_cmd(config, fault, [mode], data, args, work_base),
                log,
                args.cell_timeout,
                args.threads,
            )
        if osp.isfile(out):
            with open(out) as f:
                results.append(json.load(f))
            continue
        with open(log) as f:
            tail = f.read()[-1500:]
        results.append(
            dict(
                config=config,
                fault=fault,
                mode=mode,
                outcome='crashed',
                detected=False,
                crashed=True,
                error=f'cell process failed (rc={rc}): {tail}',
                wall_s=None,
            )
        )
    if args.keep:
        for result in results:
            result['work_dir'] = osp.join(work_base, result['mode'])
    else:
        shutil.rmtree(work_base, ignore_errors=True)
    return results


def run_cells_here(config: str, fault: str, modes: List[str], args) -> None:
    """Worker: run the cells in this process, one JSON file each."""
    for mode in modes:
        work_dir = osp.join(args.work_dir, mode)
        os.makedirs(work_dir, exist_ok=True)
        result = run_cell(
            config,
            fault,
            mode,
            work_dir=work_dir,
            data_root=args.data_root,
            fault_image=args.fault_image,
            max_iters=args.max_iters,
            fault_iter=args.fault_iter,
            ckpt_interval=args.ckpt_interval,
        )
        # checkpoints are checked; free the disk before the next cell
        for path in glob.glob(osp.join(work_dir, '*.pth')):
            os.remove(path)
        with open(osp.join(work_dir, 'cell.json'), 'w') as f:
            json.dump(result, f, indent=1)
        print(
            f'CELL DONE {config}/{fault}/{mode}: {result["outcome"]}',
            flush=True,
        )


def _yn(value) -> str:
    return {True: 'yes', False: 'NO', None: '-'}[value]


def cell_row(c: Dict[str, Any]) -> List[str]:
    """The table columns of one cell."""
    if c.get('detected'):
        delta = c.get('detect_delta')
        det = f'+{delta}' if delta is not None and delta >= 0 else str(delta)
        det = f"{det} {c['detector']}"
    else:
        det = 'no'
    n_ckpt = len(c.get('checkpoints') or {})
    ckpt = f"{_yn(c.get('checkpoints_finite'))} ({n_ckpt})"
    cause = c.get('cause') or '-'
    if c.get('cause_ok') is not None:
        cause = f"{cause} [{'ok' if c['cause_ok'] else 'WRONG'}]"
    wall = f"{c['wall_s']:.1f}" if c.get('wall_s') is not None else '-'
    counters = c.get('counters') or {}
    actions = (
        ', '.join(
            f'{counters[k]} {label}'
            for k, label in (
                ('skipped', 'steps dropped'),
                ('rollbacks', 'rollbacks'),
            )
            if counters.get(k)
        )
        or '-'
    )
    return [
        c['config'],
        FAULTS[c['fault']]['label'],
        MODE_LABELS[c['mode']],
        det,
        _yn(c.get('weights_finite')),
        ckpt,
        _yn(c.get('reached_max_iters')),
        _yn(c.get('last_loss_finite')),
        actions,
        cause,
        wall,
        c['outcome'],
    ]


HEADER = [
    'config',
    'fault',
    'mode',
    'detected (iter vs fault, by)',
    'weights finite',
    'ckpts finite (n)',
    'max_iters',
    'last loss finite',
    'guard actions',
    'cause named',
    'wall s',
    'outcome',
]


def format_table(cells: List[Dict[str, Any]], markdown: bool = False) -> str:
    """Every cell as one row, plain text or markdown."""
    rows = [HEADER] + [cell_row(c) for c in cells]
    if markdown:
        lines = [
            '| ' + ' | '.join(rows[0]) + ' |',
            '|' + '---|' * len(rows[0]),
        ]
        lines += ['| ' + ' | '.join(r) + ' |' for r in rows[1:]]
        return '\n'.join(lines)
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    return '\n'.join(
        '  '.join(v.ljust(w) for v, w in zip(r, widths)) for r in rows
    )


def format_grid(cells: List[Dict[str, Any]], config: str) -> str:
    """Markdown grid of outcomes, faults x modes, for one config."""
    by_key = {
        (c['fault'], c['mode']): c for c in cells if c['config'] == config
    }
    modes = [m for m in MODES if any(k[1] == m for k in by_key)]
    faults = [f for f in FAULTS if any(k[0] == f for k in by_key)]
    lines = [
        '| fault | ' + ' | '.join(MODE_LABELS[m] for m in modes) + ' |',
        '|' + '---|' * (len(modes) + 1),
    ]
    for fault in faults:
        row = []
        for mode in modes:
            c = by_key.get((fault, mode))
            if c is None:
                row.append('')
                continue
            text = c['outcome']
            if c.get('detected') and c.get('detect_delta') is not None:
                text += f" ({c['detect_delta']:+d})"
            if c.get('cause_ok') is not None:
                cause = str(c.get('cause')).split(' (')[0]
                text += f"; cause {cause} {'ok' if c['cause_ok'] else 'WRONG'}"
            row.append(text)
        lines.append(f"| {FAULTS[fault]['label']} | " + ' | '.join(row) + ' |')
    return '\n'.join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        '--configs', nargs='+', default=list(CONFIGS), choices=CONFIGS
    )
    parser.add_argument(
        '--faults', nargs='+', default=list(FAULTS), choices=list(FAULTS)
    )
    parser.add_argument(
        '--modes', nargs='+', default=list(MODES), choices=MODES
    )
    parser.add_argument('--max-iters', type=int, default=6)
    parser.add_argument('--fault-iter', type=int, default=2)
    parser.add_argument('--ckpt-interval', type=int, default=2)
    parser.add_argument('--cell-timeout', type=int, default=600)
    parser.add_argument(
        '--jobs',
        type=int,
        default=1,
        help='(config, fault) groups run at once; with more than one, '
        'each gets cores // jobs torch threads (OMP_NUM_THREADS)',
    )
    parser.add_argument('--out', help='write every cell as JSON')
    parser.add_argument('--png', help='draw the matrix into this PNG')
    parser.add_argument('--markdown', help='write the tables as markdown')
    parser.add_argument(
        '--keep',
        action='store_true',
        help='keep the work dirs (logs, incident folders; '
        'checkpoints are deleted once checked)',
    )
    parser.add_argument('--cell', nargs='+', help=argparse.SUPPRESS)
    parser.add_argument('--data-root', help=argparse.SUPPRESS)
    parser.add_argument('--work-dir', help=argparse.SUPPRESS)
    parser.add_argument('--fault-image', help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cell:
        run_cells_here(args.cell[0], args.cell[1], args.cell[2:], args)
        return 0
    args.threads = 0
    if args.jobs > 1:
        args.threads = max(1, (os.cpu_count() or 1) // args.jobs)
    if not 0 < args.fault_iter < args.max_iters:
        parser.error(
            f'--fault-iter {args.fault_iter} must be in '
            f'(0, --max-iters {args.max_iters})'
        )
    scratch = tempfile.mkdtemp(prefix='nanguard_fault_matrix_')
    data = prepare_data(
        osp.join(scratch, 'data'), args.configs, args.faults, args.fault_iter
    )
    start = time.time()
    total = len(args.configs) * len(args.faults) * len(args.modes)
    groups = [(c, f) for c in args.configs for f in args.faults]
    done: List[Dict[str, Any]] = []

    def run(group):
        results = run_group(*group, args.modes, data, args, scratch)
        for cell in results:
            done.append(cell)
            print(
                f'[{len(done)}/{total} {time.time() - start:.0f}s] '
                + '  '.join(cell_row(cell)),
                flush=True,
            )
        return results

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        cells = [cell for group in pool.map(run, groups) for cell in group]
    if not args.keep:
        shutil.rmtree(scratch, ignore_errors=True)
    print()
    print(format_table(cells))
    meta = dict(
        args={
            k: v
            for k, v in vars(args).items()
            if not k.startswith('cell') and v is not None
        },
        argv=sys.argv,
        total_s=time.time() - start,
        outcomes=OUTCOMES,
        date=time.strftime('%Y-%m-%d %H:%M:%S %Z'),
        machine=dict(
            nproc=os.cpu_count(),
            platform=platform.platform(),
            python=platform.python_version(),
            torch=torch.__version__,
        ),
    )
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(dict(meta=meta, cells=cells), f, indent=1)
    if args.markdown:
        with open(args.markdown, 'w') as f:
            for config in args.configs:
                f.write(f'### {config}\n\n{format_grid(cells, config)}\n\n')
            f.write(format_table(cells, markdown=True) + '\n')
    if args.png:
        from plot_fault_matrix import plot

        plot(cells, args.png)
    return 0


if __name__ == '__main__':
    sys.exit(main())
