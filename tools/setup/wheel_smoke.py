# Copyright (c) mmnanguard contributors. All rights reserved.
"""Check an installed mmnanguard wheel in a venv without mmrotate and mmseg.

Run by ``tools/setup/check_wheel.sh`` with the core venv's python, from an
empty folder outside the repository (a user's own project folder)::

    python wheel_smoke.py --wheel DIST/mmnanguard-*.whl --source REPO

It checks, and exits 1 with one ``FAILED: ...`` line per failed check:

1. the wheel holds every file of ``configs/`` and ``tools/*.py`` byte for
   byte under ``mmnanguard/.mim/``, and the console entry points of
   :data:`mmnanguard.cli.COMMANDS`;
2. ``import mmnanguard`` loads the installed copy, with mmrotate and mmseg
   missing; the core modules are registered, each rotated module is a
   placeholder whose build raises ``MissingPackageError`` naming mmrotate;
3. every console entry point answers ``--help`` (exit 0, its own name);
4. ``mmnanguard-train`` trains RetinaNet (``mmdet::`` config plus
   ``mmnanguard::_base_/nanguard.py``, written here; then the same with
   ``safe_modules.py``, which must swap in ``StableFocalLoss``) 2
   iterations with a NaN gradient planted at iteration 1: exit 0, one
   ``nonfinite_grad`` incident at iteration 1 skipped, finite weights and
   the counters in the checkpoint;
5. ``mmnanguard-check-dataset``, ``-doctor`` and ``-check-loss`` run on
   that config (exit 0, or 1 for findings; no traceback);
6. configs that need mmrotate stop with exit 2 and a message naming it,
   no traceback.
"""

import argparse
import glob
import json
import os
import os.path as osp
import subprocess
import sys
import time
import zipfile
from typing import Callable, Dict, List, Sequence

FAILURES: List[str] = []

USER_CONFIG = """\
_base_ = [
    'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py',
    'mmnanguard::_base_/{include}.py',
]
data_root = {data_root!r}
metainfo = dict(classes=('square', 'bar', 'block'))
model = dict(
    backbone=dict(depth=18, init_cfg=None),
    neck=dict(in_channels=[64, 128, 256, 512], out_channels=64),
    bbox_head=dict(num_classes=3, in_channels=64, feat_channels=64),
)
train_dataloader = dict(
    batch_size=2,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(
        data_root=data_root,
        metainfo=metainfo,
        ann_file='annotations/instances.json',
        data_prefix=dict(img='images/'),
        pipeline=[
            dict(type='LoadImageFromFile'),
            dict(type='LoadAnnotations', with_bbox=True),
            dict(type='Resize', scale=(128, 128), keep_ratio=True),
            dict(type='RandomFlip', prob=0.5),
            dict(type='PackDetInputs'),
        ],
    ),
)
train_cfg = dict(
    _delete_=True, type='IterBasedTrainLoop', max_iters=2, val_interval=100
)
param_scheduler = []
val_cfg = val_dataloader = val_evaluator = None
test_cfg = test_dataloader = test_evaluator = None
default_hooks = dict(
    logger=dict(interval=1),
    checkpoint=dict(type='CheckpointHook', interval=2, by_epoch=False),
    visualization=dict(draw=False),
)
log_processor = dict(window_size=1, by_epoch=False)
randomness = dict(seed=0)
custom_hooks = [dict(type='FaultInjectionHook', fault='nan_grad', iteration=1)]
"""

#: file name -> (config text, what stderr must contain): configs that need
#: mmrotate, which the core venv does not have.
NEEDS_MMROTATE = {
    'gd_loss.py': (
        "_base_ = './user_retinanet.py'\n"
        "model = dict(bbox_head=dict(loss_bbox=dict(type='SafeGDLoss')))\n",
        "type='SafeGDLoss' needs mmrotate",
    ),
    'rotated_scope.py': (
        "_base_ = './user_retinanet.py'\ndefault_scope = 'mmrotate'\n",
        "default_scope='mmrotate' needs mmrotate",
    ),
    'rotated_base.py': (
        "_base_ = ['mmnanguard::tiny/"
        "rotated-retinanet-rbox-le90_r18_tiny-dota.py']\n",
        'mmrotate is not installed',
    ),
}


#: The config of :data:`NEEDS_MMROTATE` that the dataset scan is run on.
NEEDS_SCAN = 'rotated_scope.py'


def check(ok: bool, what: str, detail: str = '') -> bool:
    """Record ``what`` as failed unless ``ok``; print the outcome, with
    ``detail`` (e.g. the end of a command's stderr) only on failure."""
    print(f'[wheel-smoke] {"ok" if ok else "FAILED"}: {what}', flush=True)
    if not ok:
        FAILURES.append(what)
        if detail:
            print(detail, flush=True)
    return ok


def check_wheel_contents(wheel: str, source: str) -> None:
    """Configs and tools byte for byte, and the console entry points."""
    from mmnanguard.cli import COMMANDS

    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        shipped = sorted(
            glob.glob(
                osp.join(source, 'configs', '**', '*.py'), recursive=True
            )
            + glob.glob(osp.join(source, 'tools', '*.py'))
        )
        missing, differ = [], []
        for path in shipped:
            rel = osp.relpath(path, source).replace(os.sep, '/')
            member = f'mmnanguard/.mim/{rel}'
            if member not in names:
                missing.append(rel)
            elif archive.read(member) != open(path, 'rb').read():
                differ.append(rel)
        check(
            bool(shipped) and not missing and not differ,
            f'the wheel ships {len(shipped)} configs/tools files '
            f'(missing: {missing}, different: {differ})',
        )
        entry = [n for n in names if n.endswith('entry_points.txt')]
        text = archive.read(entry[0]).decode() if entry else ''
    for command, name in COMMANDS.items():
        check(
            f'{command} = mmnanguard.cli:{name}' in text,
            f'entry point {command} = mmnanguard.cli:{name}',
        )


def check_import() -> None:
    """The installed copy imports without mmrotate and mmseg."""
    import mmnanguard
    from mmnanguard.optional import is_available

    where = osp.dirname(mmnanguard.__file__)
    check(
        where.startswith(sys.prefix) and 'site-packages' in where,
        f'mmnanguard imported from the installed wheel ({where})',
    )
    for package in ('mmrotate', 'mmseg'):
        check(not is_available(package), f'{package} is not importable')


def check_registries() -> None:
    """Core modules are classes; rotated ones raise the clear error."""
    from mmengine.registry import HOOKS, MODELS, RUNNERS, TASK_UTILS

    from mmnanguard.optional import INSTALL, MissingPackageError

    for registry, name in [
        (HOOKS, 'NanGuardHook'),
        (RUNNERS, 'NanGuardRunner'),
        (MODELS, 'StableFocalLoss'),
        (MODELS, 'SafeDiceLoss'),
        (MODELS, 'CheckedCrossEntropyLoss'),
    ]:
        check(isinstance(registry.get(name), type), f'{name} is registered')
    for registry, name in [
        (MODELS, 'SafeGDLoss'),
        (MODELS, 'SafeRotatedIoULoss'),
        (TASK_UTILS, 'SafeDeltaXYWHTRBBoxCoder'),
        (TASK_UTILS, 'SinCosAngleCoder'),
    ]:
        try:
            registry.build(dict(type=name))
            message = 'built without error'
        except MissingPackageError as err:
            message = str(err)
        check(
            f"type='{name}' needs mmrotate" in message
            and INSTALL['mmrotate'] in message,
            f'building {name} raises MissingPackageError ({message})',
        )


def run(argv: Sequence[str], timeout: float = 600) -> Dict[str, object]:
    """Run a console command of the venv; its exit status and output."""
    command = osp.join(osp.dirname(sys.executable), argv[0])
    start = time.perf_counter()
    proc = subprocess.run(
        [command, *argv[1:]],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, OMP_NUM_THREADS='1', MKL_NUM_THREADS='1'),
    )
    return dict(
        rc=proc.returncode,
        out=proc.stdout,
        err=proc.stderr,
        seconds=time.perf_counter() - start,
    )


def check_help() -> None:
    """Every console entry point answers ``--help``."""
    from mmnanguard.cli import COMMANDS

    for command, name in COMMANDS.items():
        result = run([command, '--help'])
        check(
            result['rc'] == 0 and f'usage: {name}.py' in result['out'],
            f'{command} --help: exit {result["rc"]} in '
            f'{result["seconds"]:.1f} s',
            str(result['err'])[-2000:],
        )


def check_training(folder: str, include: str, swap: str = '') -> None:
    """A user config with the include trains and reports the NaN grad.

    Args:
        folder (str): The user's project folder.
        include (str): ``nanguard`` or ``safe_modules``
            (``mmnanguard::_base_/INCLUDE.py``).
        swap (str): A module swap the run must log, e.g.
            ``'FocalLoss -> StableFocalLoss'``.
    """
    from mmengine.runner import CheckpointLoader

    from mmnanguard.datagen import generate_coco
    from mmnanguard.testing import tensors_all_finite

    data_root = osp.join(folder, 'data', 'tiny_coco', '')
    if not osp.isdir(data_root):
        generate_coco(data_root, num_images=4, img_size=128, seed=0)
    name = 'user_retinanet.py' if include == 'nanguard' else f'{include}.py'
    config = osp.join(folder, name)
    with open(config, 'w') as f:
        f.write(USER_CONFIG.format(data_root=data_root, include=include))
    work_dir = osp.join(folder, f'work_dir_{include}')
    result = run(['mmnanguard-train', config, '--work-dir', work_dir])
    if not check(
        result['rc'] == 0,
        f'mmnanguard-train {name} (mmnanguard::_base_/{include}.py) trains '
        f'2 iterations: exit {result["rc"]} in {result["seconds"]:.1f} s',
        str(result['err'])[-4000:],
    ):
        return
    if swap:
        text = str(result['out']) + str(result['err'])
        check(swap in text, f'the run logs the module swap {swap!r}')
    reports = sorted(
        glob.glob(osp.join(work_dir, 'nanguard', 'incident_*', 'report.json'))
    )
    check(len(reports) == 1, f'one incident report ({reports})')
    if reports:
        with open(reports[0]) as f:
            report = json.load(f)
        seen = {k: report.get(k) for k in ('kind', 'iteration', 'action')}
        check(
            seen == dict(kind='nonfinite_grad', iteration=1, action='skip'),
            f'the incident is the planted NaN gradient, skipped ({seen})',
        )
    ckpt = osp.join(work_dir, 'iter_2.pth')
    if check(osp.isfile(ckpt), f'checkpoint {ckpt} written'):
        state = CheckpointLoader.load_checkpoint(ckpt, map_location='cpu')
        check(
            tensors_all_finite(state['state_dict']),
            'every weight in the checkpoint is finite',
        )
        counters = state.get('nanguard', {}).get('counters', {})
        seen = {k: counters.get(k) for k in ('incidents', 'skipped')}
        check(
            seen == dict(incidents=1, skipped=1),
            f'the checkpoint counts 1 incident and 1 skipped step ({seen})',
        )


def check_analysis_tools(folder: str) -> None:
    """The analysis tools run on the user config without mmrotate/mmseg:
    the generated set is clean; the doctor and the loss battery report
    (exit 0 or 1: findings), they do not stop (exit 2) or crash."""
    config = osp.join(folder, 'user_retinanet.py')
    for command, allowed in [
        ('mmnanguard-check-dataset', (0,)),
        ('mmnanguard-doctor', (0, 1)),
        ('mmnanguard-check-loss', (0, 1)),
    ]:
        result = run([command, config])
        text = str(result['out']) + str(result['err'])
        check(
            result['rc'] in allowed and 'Traceback' not in text,
            f'{command} user_retinanet.py: exit {result["rc"]} (expected '
            f'{allowed})',
            text[-2000:],
        )


def check_needs_mmrotate(folder: str) -> None:
    """Configs that need mmrotate stop with a message saying so."""
    for name, (text, expected) in NEEDS_MMROTATE.items():
        config = osp.join(folder, name)
        with open(config, 'w') as f:
            f.write(text)
        result = run(['mmnanguard-train', config, '--work-dir', folder])
        err = str(result['err'])
        check(
            result['rc'] == 2
            and expected in err
            and 'Traceback' not in err + str(result['out']),
            f'mmnanguard-train {name}: exit {result["rc"]}, stderr has '
            f'{expected!r} and no traceback',
            err[-2000:],
        )
    result = run(['mmnanguard-check-dataset', osp.join(folder, NEEDS_SCAN)])
    err = str(result['err'])
    check(
        result['rc'] == 2 and "default_scope='mmrotate' needs mmrotate" in err,
        f'mmnanguard-check-dataset {NEEDS_SCAN}: exit {result["rc"]} '
        f'names mmrotate',
        err[-2000:],
    )


def main(argv: Sequence[str] = None) -> int:
    """Run every check; 0 when all pass, 1 otherwise."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--wheel', required=True, help='the built wheel')
    parser.add_argument('--source', required=True, help='its source tree')
    args = parser.parse_args(argv)
    folder = os.getcwd()
    steps: List[Callable[[], None]] = [
        check_import,
        lambda: check_wheel_contents(args.wheel, args.source),
        check_registries,
        check_help,
        lambda: check_training(folder, 'nanguard'),
        lambda: check_training(
            folder, 'safe_modules', 'FocalLoss -> StableFocalLoss'
        ),
        lambda: check_analysis_tools(folder),
        lambda: check_needs_mmrotate(folder),
    ]
    for step in steps:
        step()
    if FAILURES:
        print(f'[wheel-smoke] {len(FAILURES)} check(s) FAILED:', flush=True)
        for what in FAILURES:
            print(f'[wheel-smoke] FAILED: {what}', flush=True)
        return 1
    print('[wheel-smoke] all checks passed', flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
