# Copyright (c) mmnanguard contributors. All rights reserved.
"""Host reads and collectives per training iteration, guard on and off.

Counts, with :func:`mmnanguard.testing.host_syncs.count_host_syncs`, every
device->host read (``_local_scalar_dense``: ``.item()``, ``float(t)``,
``bool(t)``, ``int(t)``; data-dependent shapes: ``nonzero``, boolean-mask
indexing, ``unique``, ...; host copies: ``.tolist()``, ``.numpy()``,
``.cpu()``) and every ``torch.distributed`` collective of each training
iteration of ``tools/train.py``, attributed to ``file:line``, and reports
the mean per iteration over the steady state (the first 2 iterations left
out). On a GPU each read is a synchronisation of the host with the device
queue; on the CPU they are counted exactly, so the numbers are
deterministic (see the module docstring of ``host_syncs`` for what counts).

Each run is ``tools/train.py`` on a tiny real config (generated data,
``num_workers=0``), in a subprocess of its own:

* configs: ``dota`` (rotated RetinaNet DOTA, has ``clip_grad``), ``coco``
  (RetinaNet COCO, no ``clip_grad``), ``dota_noclip`` (the DOTA config with
  ``optim_wrapper.clip_grad=None``);
* modes: ``bare`` (``--guard off``), ``include`` (``--guard skip``: the
  ``NanGuardRunner`` with the include's defaults), ``hook``
  (``custom_hooks=[dict(type='NanGuardHook')]`` on a plain ``Runner``),
  ``check_invalid_loss`` (mmdet's ``CheckInvalidLossHook(interval=1)``);
* variants: ``fp32``; ``amp`` (``--amp``: ``CPUAmpOptimWrapper``, fp16
  CPU autocast; 128 px images, fp16 convolutions being ~25x slower on an
  AVX2 CPU); ``ddp`` (``torchrun --nproc_per_node 2 ... --launcher
  pytorch``, gloo; rank 0's counts; the collectives of rank 1 checked
  equal).

Usage::

    python benchmarks/host_syncs.py                 # every default run
    python benchmarks/host_syncs.py --runs dota/fp32/bare dota/fp32/include
    python benchmarks/host_syncs.py --out benchmarks/host_syncs.json
"""

import argparse
import importlib.util
import json
import os
import os.path as osp
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

#: config key -> (description, tiny config attribute, clip_grad removed)
CONFIGS = {
    'dota': ('rotated RetinaNet DOTA (clip_grad)', 'TINY_DOTA_CONFIG', False),
    'coco': ('RetinaNet COCO (no clip_grad)', 'TINY_COCO_CONFIG', False),
    'dota_noclip': (
        'rotated RetinaNet DOTA, clip_grad=None',
        'TINY_DOTA_CONFIG',
        True,
    ),
}
#: mode -> (description, --guard value, custom hooks)
MODES = {
    'bare': ('bare mmengine (--guard off)', 'off', []),
    'check_invalid_loss': (
        "mmdet's CheckInvalidLossHook(interval=1)",
        'off',
        [dict(type='mmdet.CheckInvalidLossHook', interval=1)],
    ),
    'hook': (
        'NanGuardHook alone (custom_hooks)',
        'off',
        [dict(type='NanGuardHook')],
    ),
    'include': ('the include (--guard skip)', 'skip', []),
}
VARIANTS = {
    'fp32': 'fp32',
    'amp': '--amp (CPUAmpOptimWrapper, fp16, 128 px)',
    'ddp': '2-process gloo DDP (rank 0)',
}
#: The runs made by default, as ``config/variant/mode``.
DEFAULT_RUNS = (
    [f'dota/fp32/{m}' for m in MODES]
    + [f'coco/fp32/{m}' for m in MODES]
    + ['dota_noclip/fp32/bare', 'dota_noclip/fp32/include']
    + ['dota/amp/bare', 'dota/amp/include']
    + ['dota/ddp/bare', 'dota/ddp/include']
)
#: Iterations per run: 2 warm-up iterations left out, 6 averaged.
ITERS = 8
SKIP = 2
DDP_PROCS = 2
IMAGES = 8


def prepare_config(
    config: str,
    variant: str,
    mode: str,
    data_root: str,
    work_dir: str,
    iters: int = ITERS,
    img_scale: Optional[int] = None,
) -> str:
    """Write the config of one run (a standalone dump) into ``work_dir``.

    Args:
        config (str): A key of :data:`CONFIGS`.
        variant (str): A key of :data:`VARIANTS`.
        mode (str): A key of :data:`MODES`.
        data_root (str): Generated data (``generate_dota``/``generate_coco``).
        work_dir (str): The run's work dir (created).
        iters (int): Training iterations (an ``IterBasedTrainLoop``; no
            checkpoint is written).
        img_scale (int, optional): Resize to this square size. Defaults to
            the config's 256 px, 128 px under ``amp``.

    Returns:
        str: Path of the written config.
    """
    from mmnanguard import testing
    from mmnanguard.testing import load_tiny_config

    _, attr, no_clip = CONFIGS[config]
    os.makedirs(work_dir, exist_ok=True)
    cfg = load_tiny_config(
        getattr(testing, attr), work_dir, data_root, max_iters=iters
    )
    cfg.default_hooks.checkpoint = dict(
        type='CheckpointHook', interval=10**6, by_epoch=False, save_last=False
    )
    cfg.custom_hooks = list(MODES[mode][2])
    if no_clip:
        cfg.optim_wrapper.clip_grad = None
    if img_scale is None and variant == 'amp':
        img_scale = 128
    if img_scale is not None:
        for transform in cfg.train_dataloader.dataset.pipeline:
            if transform['type'].endswith('Resize'):
                transform['scale'] = (img_scale, img_scale)
    path = osp.join(work_dir, f'{config}_{variant}_{mode}.py')
    cfg.dump(path)
    return path


def _train_tool():
    from mmnanguard.testing.tiny_configs import MIM_ROOT

    path = osp.join(MIM_ROOT, 'tools', 'train.py')
    spec = importlib.util.spec_from_file_location('nanguard_train_tool', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def train_args(
    config_path: str, mode: str, variant: str, work_dir: str
) -> List[str]:
    """``tools/train.py``'s arguments for one run."""
    args = [config_path, '--guard', MODES[mode][1], '--work-dir', work_dir]
    if variant == 'amp':
        args.append('--amp')
    if variant == 'ddp':
        args += ['--launcher', 'pytorch']
    return args


def count_training(argv: Sequence[str], skip: int = SKIP) -> Dict[str, Any]:
    """Run ``tools/train.py ARGV`` in this process, counting.

    Args:
        argv (list[str]): ``tools/train.py``'s arguments.
        skip (int): Leading iterations left out of the means.

    Returns:
        dict: :meth:`SyncCounts.per_iteration`, with ``counted_iters``
        (every iteration counted) and ``rank``.

    Raises:
        RuntimeError: ``tools/train.py`` exited with a non-zero status.
    """
    from mmnanguard.testing.host_syncs import count_host_syncs

    tool = _train_tool()
    with count_host_syncs() as counts:
        status = tool.main(list(argv))
    if status != 0:
        raise RuntimeError(f'tools/train.py {argv} exited with {status}')
    result = counts.per_iteration(skip)
    result['counted_iters'] = len(counts.iterations)
    result['rank'] = int(os.environ.get('RANK', 0))
    return result


def _worker(argv: List[str]) -> int:
    out, train = argv[0], argv[1:]
    result = count_training(train)
    if 'RANK' in os.environ:
        out = f'{out}.rank{os.environ["RANK"]}'
    with open(out, 'w') as f:
        json.dump(result, f)
    return 0


def free_port() -> int:
    """A TCP port free on this machine now (for ``torchrun``)."""
    import socket

    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def run_one(run: str, data_roots: Dict[str, str], tmp: str) -> Dict[str, Any]:
    """One run (``config/variant/mode``) in a subprocess; its counts."""
    config, variant, mode = run.split('/')
    work_dir = osp.join(tmp, run.replace('/', '_'))
    root = data_roots['coco' if config == 'coco' else 'dota']
    path = prepare_config(config, variant, mode, root, work_dir)
    out = osp.join(work_dir, 'counts.json')
    train = train_args(path, mode, variant, work_dir)
    if variant == 'ddp':
        cmd = [
            sys.executable,
            '-m',
            'torch.distributed.run',
            '--nproc_per_node',
            str(DDP_PROCS),
            '--master_port',
            str(free_port()),
        ]
    else:
        cmd = [sys.executable]
    cmd += [__file__, '--worker', out] + train
    env = dict(os.environ, PYTHONWARNINGS='ignore', OMP_NUM_THREADS='1')
    start = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f'{run} failed:\n{proc.stderr[-4000:]}')
    if variant == 'ddp':
        ranks = []
        for rank in range(DDP_PROCS):
            with open(f'{out}.rank{rank}') as f:
                ranks.append(json.load(f))
        result = ranks[0]
        # reads differ a little between ranks (data-dependent shapes of
        # their own batches); collectives must not
        result['ranks_agree'] = all(
            r['collectives_each'] == result['collectives_each'] for r in ranks
        )
        result['rank_reads'] = [r['reads'] for r in ranks]
        result['rank_collectives'] = [r['collectives'] for r in ranks]
    else:
        with open(out) as f:
            result = json.load(f)
    result.update(
        run=run, config=config, variant=variant, mode=mode, wall_s=0.0
    )
    result['wall_s'] = round(time.time() - start, 1)
    return result


def added_over_bare(results: List[Dict[str, Any]]) -> None:
    """Set ``added_reads``, ``added_collectives`` and ``site_diff`` (site
    -> added reads or collectives per iteration) of every run that has a
    bare run of the same config and variant (in place)."""
    bare = {
        (r['config'], r['variant']): r for r in results if r['mode'] == 'bare'
    }
    for r in results:
        base = bare.get((r['config'], r['variant']))
        if base is None:
            continue
        r['added_reads'] = r['reads'] - base['reads']
        r['added_collectives'] = r['collectives'] - base['collectives']
        diff = {}
        for key in ('read_sites', 'collective_sites'):
            sites = set(r[key]) | set(base[key])
            for site in sites:
                d = r[key].get(site, 0.0) - base[key].get(site, 0.0)
                if abs(d) > 1e-9:
                    diff[f'{key[:-6]} {site}'] = d
        r['site_diff'] = dict(
            sorted(diff.items(), key=lambda kv: (-abs(kv[1]), kv[0]))
        )


def _num(value: Optional[float], signed: bool = False) -> str:
    if value is None:
        return ''
    text = f'{value:+.2f}' if signed else f'{value:.2f}'
    return text.replace('.00', '')


def format_table(results: List[Dict[str, Any]]) -> str:
    """The Markdown table: config x variant x mode."""
    lines = [
        '| config | variant | mode | reads/iter | added over bare '
        '| collectives/iter | added over bare | iters |',
        '|---|---|---|---|---|---|---|---|',
    ]
    for r in results:
        lines.append(
            f'| {CONFIGS[r["config"]][0]} | {VARIANTS[r["variant"]]} '
            f'| {MODES[r["mode"]][0]} | {_num(r["reads"])} '
            f'| {_num(r.get("added_reads"), True)} '
            f'| {_num(r["collectives"])} '
            f'| {_num(r.get("added_collectives"), True)} '
            f'| {r["iterations"]} |'
        )
    return '\n'.join(lines)


def format_sites(results: List[Dict[str, Any]]) -> str:
    """Per run: the guard's own sites (``mmnanguard/...``) with their
    reads and collectives per iteration, and every other site whose count
    differs from the bare run."""
    out = []
    for r in results:
        if r['mode'] == 'bare':
            continue
        kinds = (('read', 'read_sites'), ('collective', 'collective_sites'))
        own = [
            (kind, site, n)
            for kind, key in kinds
            for site, n in r[key].items()
            if site.startswith('mmnanguard/')
        ]
        other = [
            (k, d)
            for k, d in r.get('site_diff', {}).items()
            if not k.split(' ', 1)[1].startswith('mmnanguard/')
        ]
        if not own and not other:
            continue
        out.append(
            f'\n**{r["config"]} / {r["variant"]} / {r["mode"]}** '
            f'({_num(r.get("added_reads"), True)} reads, '
            f'{_num(r.get("added_collectives"), True)} collectives per '
            'iteration over bare)\n'
        )
        out.append('| site | kind | per iter |')
        out.append('|---|---|---|')
        for kind, site, n in sorted(own, key=lambda x: (x[1], x[0])):
            out.append(f'| `{site}` | {kind} | {_num(n)} |')
        for key, d in other:
            kind, site = key.split(' ', 1)
            out.append(
                f'| `{site}` (not the guard, vs bare) | {kind} '
                f'| {_num(d, True)} |'
            )
    return '\n'.join(out)


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ['--worker']:
        return _worker(argv[1:])
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        '--runs',
        nargs='+',
        default=list(DEFAULT_RUNS),
        metavar='CONFIG/VARIANT/MODE',
        help='runs to make (default: all of DEFAULT_RUNS)',
    )
    parser.add_argument(
        '--out',
        default=osp.join(REPO, 'benchmarks', 'host_syncs.json'),
        help='JSON file for the results',
    )
    args = parser.parse_args(argv)
    for run in args.runs:
        parts = run.split('/')
        if (
            len(parts) != 3
            or parts[0] not in CONFIGS
            or parts[1] not in VARIANTS
            or parts[2] not in MODES
        ):
            parser.error(f'unknown run {run!r}')
    import torch

    from mmnanguard.datagen import generate_coco, generate_dota

    results = []
    with tempfile.TemporaryDirectory(prefix='host_syncs_') as tmp:
        roots = dict(dota=osp.join(tmp, 'dota'), coco=osp.join(tmp, 'coco'))
        generate_dota(roots['dota'], num_images=IMAGES, seed=0)
        generate_coco(roots['coco'], num_images=IMAGES, seed=0)
        for run in args.runs:
            result = run_one(run, roots, tmp)
            results.append(result)
            print(
                f'{run}: {result["reads"]:.2f} reads/iter, '
                f'{result["collectives"]:.2f} collectives/iter '
                f'({result["wall_s"]} s)',
                flush=True,
            )
    added_over_bare(results)
    print()
    print(format_table(results))
    print(format_sites(results))
    with open(args.out, 'w') as f:
        json.dump(
            dict(
                torch=torch.__version__,
                iters=ITERS,
                skip=SKIP,
                runs=results,
            ),
            f,
            indent=1,
        )
    return 0


if __name__ == '__main__':
    sys.exit(main())
