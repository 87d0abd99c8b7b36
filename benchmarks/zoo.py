# Copyright (c) mmnanguard contributors. All rights reserved.
"""The zoo sweep: the include on every model family of the pinned mmrotate,
mmdet and mmseg, trained with a fault planted, and a static pass over every
upstream config.

``sweep``: one representative config per family (``zoo_families.py``),
shrunk for the CPU and trained for ``--iters`` iterations with
``mmnanguard::_base_/nanguard.py`` included and an inf loss term or a NaN
gradient planted at iteration 1 (alternating over the families, or
``--fault``), each in its own subprocess with a timeout and one torch
thread (``zoo_cell.py``). A cell that errors is run again without the
include and without a fault: if that run passes, the failure is
mmnanguard's; if it fails too, the config cannot run here, and why
(a missing CPU kernel, a missing package, a download, data that cannot be
generated) is its classification. A cell stopped by a missing CPU kernel
is run once more with ``mmnanguard::_base_/safe_modules.py`` instead of
the include (its drop-ins replace some CUDA-only losses).

The sweep merges into its ``--out`` file (``benchmarks/zoo_sweep.json``
by default): a family run again replaces its cell, the other cells are
kept, and ``meta.runs`` lists every run merged into it (command, start,
end). So a sweep done in parts (``--skip`` the file
itself to run the families not done yet, ``--families`` to run some
again) ends as one file; ``--fresh`` starts the file anew.

``static``: every upstream config loaded with the include and rewritten
as the runner would, without training (``zoo_static.py``).

``markdown``: the tables of ``benchmarks/RESULTS.md`` ("Zoo sweep") from
the two JSON files.

Usage::

    python benchmarks/zoo.py sweep --subset --out benchmarks/zoo_sweep.json
    python benchmarks/zoo.py sweep --skip benchmarks/zoo_sweep.json
    python benchmarks/zoo.py sweep --families mmdet/mask_rcnn mmseg/ocrnet
    python benchmarks/zoo.py static --out benchmarks/zoo_static.json
    python benchmarks/zoo.py markdown benchmarks/zoo_sweep.json \\
        --static benchmarks/zoo_static.json
"""

import argparse
import functools
import json
import os
import os.path as osp
import platform
import re
import shutil
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

HERE = osp.dirname(osp.abspath(__file__))
REPO = osp.dirname(HERE)
sys.path[:0] = [HERE, REPO]

from fault_matrix import _spawn  # noqa: E402
from zoo_families import (  # noqa: E402
    IMG_SIDE,
    PACKAGES,
    SWEEP_SUBSET,
    families,
    representative,
)

FAULTS = ('inf_loss', 'nan_grad')
#: An absolute path of this machine in the JSON text (not the repo's).
MACHINE_PATH = r'(?<![\w.<])/(?:tmp|root|home|work|usr)/[^"\s:]*'


def run_cell_subprocess(
    config: str,
    cell_dir: str,
    data_dir: str,
    fault: str,
    iters: int,
    timeout: int,
    include: str = 'nanguard',
    img_side: Optional[int] = None,
) -> Dict[str, Any]:
    """One cell in a fresh interpreter; its result, or what killed it."""
    name = include
    work_dir = osp.join(cell_dir, name)
    out = osp.join(cell_dir, f'{name}.json')
    cmd = [
        sys.executable,
        osp.join(HERE, 'zoo_cell.py'),
        config,
        '--work-dir',
        work_dir,
        '--data-dir',
        data_dir,
        '--out',
        out,
        '--fault',
        fault,
        '--iters',
        str(iters),
        '--include',
        include,
    ] + (['--img-side', str(img_side)] if img_side else [])
    log = osp.join(cell_dir, f'{name}.log')
    start = time.perf_counter()
    code = _spawn(cmd, log, timeout, threads=1)
    wall = round(time.perf_counter() - start, 1)
    failure = None
    if code == 'timeout':
        failure = dict(category='timeout', detail=f'over {timeout} s')
    elif not osp.exists(out):
        with open(log) as f:
            tail = f.read()[-600:]
        failure = dict(
            category='upstream',
            detail=f'process died (exit {code})',
            error=tail,
        )
    if failure is not None:
        return dict(
            config=config, status='error', wall_s=wall, log=log, **failure
        )
    with open(out) as f:
        result = json.load(f)
    result['process_wall_s'] = wall
    result['log'] = log
    return result


def _trainable(config: str, tmp_dir: str) -> bool:
    """Whether an upstream config loads and defines a model and a
    training data loader (checked in this process, without the include)."""
    from zoo_cell import load_with_include

    try:
        cfg = load_with_include(config, tmp_dir, include='none')
    except Exception:  # a config that does not load is not usable
        return False
    return isinstance(cfg.get('model'), dict) and bool(
        cfg.get('train_dataloader')
    )


def classify(guard: Dict[str, Any], bare: Optional[Dict[str, Any]]) -> str:
    """The cell's outcome, a key of ``zoo_report.OUTCOMES``."""
    status = guard['status']
    if status == 'pass':
        return 'pass_'
    if status == 'fail':
        return 'fail'
    if status in ('no_data', 'no_model'):
        return status
    if bare is not None and bare['status'] == 'pass':
        return 'nanguard'
    if guard.get('category') == 'nanguard' and (
        bare is None or bare.get('error') != guard.get('error')
    ):
        return 'nanguard'  # raised in mmnanguard, not what stops bare
    if bare is not None and bare.get('category') not in (None, 'nanguard'):
        return bare['category']
    return guard.get('category', 'upstream')


def _selected(family: str, args, done: List[str]) -> bool:
    """Whether ``--families`` / ``--subset`` / ``--skip`` select
    ``family``."""
    if family in done:
        return False
    if args.families:
        return family in args.families
    if args.subset:
        return family.startswith('mmrotate/') or family in SWEEP_SUBSET
    return True


def load_sweep(path: str) -> Tuple[List[Dict[str, Any]], List[Dict]]:
    """The cells and the runs (``meta`` of each) of the sweep JSON at
    ``path``; none when there is no such file. A file written by one run
    before runs were merged has its ``meta`` as its one run."""
    if not osp.exists(path):
        return [], []
    with open(path) as f:
        data = json.load(f)
    meta = data.get('meta') or {}
    return data['cells'], list(meta.get('runs', [meta] if meta else []))


def merge_cells(
    old: List[Dict[str, Any]], new: List[Dict[str, Any]]
) -> List[Dict[str, Any]]:
    """``old`` with each family of ``new`` replacing its cell where it was,
    and the families ``old`` has not appended in ``new``'s order."""
    by_family = {cell['family']: cell for cell in old}
    by_family.update((cell['family'], cell) for cell in new)
    return list(by_family.values())


def sweep(args) -> int:
    """Train one cell per family; merge the cells into ``args.out`` after
    every cell (see the module docstring)."""
    work_root = args.work_root or tempfile.mkdtemp(prefix='zoo_')
    data_dir = osp.join(work_root, 'data')
    os.makedirs(data_dir, exist_ok=True)
    cells: List[Dict[str, Any]] = []
    kept, runs = ([], []) if args.fresh else load_sweep(args.out)
    chosen = []
    done = []
    for path in args.skip or []:
        with open(path) as f:
            done += [c['family'] for c in json.load(f)['cells']]
    load_dir = osp.join(work_root, 'load')
    for package in args.packages:
        for family, configs in families(package).items():
            if not _selected(family, args, done):
                continue
            chosen.append(
                (
                    family,
                    *representative(
                        family, configs, lambda c: _trainable(c, load_dir)
                    ),
                )
            )
    started = time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())
    for index, (family, config, why) in enumerate(chosen):
        fault = args.fault or FAULTS[index % 2]
        cell_dir = osp.join(work_root, family.replace('/', '__'))
        os.makedirs(cell_dir, exist_ok=True)
        side = IMG_SIDE.get(family, (None,))[0]
        run = functools.partial(
            run_cell_subprocess, config, cell_dir, data_dir, fault,
            args.iters, args.timeout, img_side=side,
        )  # fmt: skip
        guard = run('nanguard')
        bare = safe = None
        if guard['status'] == 'error' and guard['category'] != 'timeout':
            bare = run('none')
        outcome = classify(guard, bare)
        if outcome == 'cpu_kernel':
            # the safe drop-ins replace some CUDA-only losses
            safe = run('safe_modules')
        cells.append(
            dict(
                family=family,
                config=config,
                why=why,
                fault=fault,
                outcome=outcome,
                img_side=side,
                guard=guard,
                bare=bare,
                safe_modules=safe,
            )
        )
        print(
            f'[{index + 1}/{len(chosen)}] {family}: {outcome} '
            f"({guard.get('wall_s')} s) "
            f"{guard.get('detail') or guard.get('reason') or ''}"
            + (f" / safe_modules: {safe['status']}" if safe else ''),
            flush=True,
        )
        meta = dict(runs=runs + [_meta(args, started)])
        data = dict(meta=meta, cells=merge_cells(kept, cells))
        _write(args.out, data, work_root)
        # the cell's checkpoints and incidents are summarised in the JSON
        shutil.rmtree(cell_dir, ignore_errors=True)
    return 0


def static(args) -> int:
    """The static pass over every upstream config of ``args.packages``."""
    from zoo_families import all_configs
    from zoo_static import static_check

    import mmnanguard  # noqa: F401  (mends before any config is read)

    tmp_dir = tempfile.mkdtemp(prefix='zoo_static_')
    started = time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())
    results = []
    configs = [c for p in args.packages for c in all_configs(p)]
    if args.limit:
        configs = configs[: args.limit]
    for i, config in enumerate(configs):
        results.append(static_check(config, tmp_dir))
        if (i + 1) % 50 == 0 or i + 1 == len(configs):
            print(f'[{i + 1}/{len(configs)}] {config}', flush=True)
            _write(
                args.out,
                dict(meta=_meta(args, started), configs=results),
                tmp_dir,
            )
    return 0


def _meta(args, started: str) -> Dict[str, Any]:
    import torch

    return dict(
        command=' '.join(['python'] + sys.argv),
        started=started,
        finished=time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime()),
        machine=platform.platform(),
        cpus=os.cpu_count(),
        torch=torch.__version__,
        torch_threads=1,
        args={k: v for k, v in vars(args).items() if k != 'func'},
    )


def _write(path: str, data: Dict[str, Any], work_root: str) -> None:
    """Write ``data`` as JSON, with the paths of this machine made
    relative: the repository's own, ``<work_root>`` for the run's
    temporary folder, ``<path>`` for any other absolute path."""
    text = json.dumps(data, indent=1, default=str)
    text = text.replace(work_root, '<work_root>').replace(REPO + '/', '')
    text = re.sub(MACHINE_PATH, '<path>', text)
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    with open(path, 'w') as f:
        f.write(text + '\n')


def markdown(args) -> int:
    """Print the "Zoo sweep" tables from the sweep and static JSON."""
    from zoo_report import cpu_impossible, format_static, format_sweep

    cells: List[Dict[str, Any]] = []
    for path in args.sweeps:  # a later file's cell replaces an earlier one
        cells = merge_cells(cells, load_sweep(path)[0])
    print(format_sweep(dict(cells=cells)))
    impossible = cpu_impossible(cells)
    if impossible:
        print('Missing CPU kernels (mmcv 2.0.1) and the families they stop:')
        for op, fams in impossible.items():
            print(f'* `{op}`: ' + ', '.join(fams))
        print()
    if args.static:
        with open(args.static) as f:
            print(format_static(json.load(f)))
    return 0


def parse_args(argv: Optional[List[str]] = None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest='command', required=True)
    s = sub.add_parser('sweep', help='train one config per family')
    s.add_argument('--packages', nargs='+', default=list(PACKAGES))
    s.add_argument('--families', nargs='*', help='e.g. mmdet/mask_rcnn')
    s.add_argument(
        '--subset',
        action='store_true',
        help='every mmrotate family and zoo_families.SWEEP_SUBSET',
    )
    s.add_argument(
        '--skip', nargs='*', help='sweep JSON files whose families are done'
    )
    s.add_argument('--fault', choices=FAULTS, help='default: alternate')
    s.add_argument('--iters', type=int, default=3)
    s.add_argument('--timeout', type=int, default=240, help='s per cell')
    s.add_argument('--work-root', help='default: a new temp folder')
    s.add_argument(
        '--out',
        default=osp.join(HERE, 'zoo_sweep.json'),
        help='the sweep JSON the cells are merged into',
    )
    s.add_argument(
        '--fresh',
        action='store_true',
        help='start --out anew instead of merging into it',
    )
    s.set_defaults(func=sweep)
    t = sub.add_parser('static', help='rewrite every config, no training')
    t.add_argument('--packages', nargs='+', default=list(PACKAGES))
    t.add_argument('--limit', type=int, help='the first N configs only')
    t.add_argument('--out', default=osp.join(HERE, 'zoo_static.json'))
    t.set_defaults(func=static)
    m = sub.add_parser('markdown', help='the RESULTS.md tables')
    m.add_argument(
        'sweeps', nargs='+', help='sweep JSON files (a later one wins)'
    )
    m.add_argument('--static', help='the static pass JSON')
    m.set_defaults(func=markdown)
    args = parser.parse_args(argv)
    for package in getattr(args, 'packages', []):
        if package not in PACKAGES:
            parser.error(
                f'--packages {package!r} is invalid; allowed values are '
                f'{PACKAGES}'
            )
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    return args.func(args)


if __name__ == '__main__':
    sys.exit(main())
