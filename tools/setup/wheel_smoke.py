# Copyright (c) mmnanguard contributors. All rights reserved.
"""Check an installed mmnanguard wheel on one supported stack.

Run by ``tools/setup/check_wheel.sh`` with the stack venv's python, from an
empty folder outside the repository (a user's own project folder)::

    python wheel_smoke.py --wheel DIST/mmnanguard-*.whl --source REPO \
        --stack mmdet --present mmdet mmseg --absent mmrotate

It checks, and exits 1 with one ``FAILED: ...`` line per failed check:

1. the wheel holds every file of ``configs/`` and ``tools/*.py`` byte for
   byte under ``mmnanguard/.mim/``, and the console entry points of
   :data:`mmnanguard.cli.COMMANDS`;
2. ``import mmnanguard`` loads the installed copy; mmrotate, mmseg and
   the toolboxes (mmyolo, mmpretrain, mmpose, mmocr) are importable
   exactly where the stack has them; the core modules are registered, and
   each rotated module is the real class where mmrotate is present, else a
   placeholder whose build raises ``MissingPackageError`` naming mmrotate;
3. every console entry point answers ``--help`` (exit 0, its own name);
4. ``mmnanguard-train`` trains a user's RetinaNet, FCN (with mmseg) and
   rotated RetinaNet (with mmrotate) config, each through
   ``mmnanguard::_base_/nanguard.py`` with a NaN gradient planted at
   iteration 1, then RetinaNet with ``safe_modules.py`` (which must swap
   in ``StableFocalLoss``), and resumes RetinaNet to iteration 4
   (:mod:`smoke_runs`);
5. ``mmnanguard-check-dataset``, ``-doctor`` and ``-check-loss`` run on
   the RetinaNet config (exit 0, or 1 for findings; no traceback);
6. without mmrotate, configs that need it stop with exit 2 and a message
   naming it, no traceback.
"""

import argparse
import glob
import os
import os.path as osp
import sys
import zipfile
from typing import Callable, List, Sequence

from smoke_runs import FAILURES, check, run, run_steps

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


#: The configs of :data:`NEEDS_MMROTATE` that the dataset scan is run on.
NEEDS_SCAN = ('rotated_scope.py', 'rotated_base.py')


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


def check_import(present: Sequence[str]) -> None:
    """The installed copy imports; the optional packages are importable
    exactly where the stack has them."""
    import mmnanguard
    from mmnanguard.optional import is_available

    where = osp.dirname(mmnanguard.__file__)
    check(
        where.startswith(sys.prefix) and 'site-packages' in where,
        f'mmnanguard imported from the installed wheel ({where})',
    )
    for package in (
        'mmrotate',
        'mmseg',
        'mmyolo',
        'mmpretrain',
        'mmpose',
        'mmocr',
        'mmaction',
    ):
        expected = package in present
        check(
            is_available(package) == expected,
            f'{package} is {"" if expected else "not "}importable',
        )


def check_registries(present: Sequence[str]) -> None:
    """Core modules are classes; rotated ones are classes with mmrotate,
    else raise the clear error."""
    from mmengine.registry import HOOKS, MODELS, RUNNERS, TASK_UTILS

    from mmnanguard.optional import INSTALL, MissingPackageError

    core = [
        (HOOKS, 'NanGuardHook'),
        (RUNNERS, 'NanGuardRunner'),
        (MODELS, 'StableFocalLoss'),
        (MODELS, 'SafeDiceLoss'),
        (MODELS, 'CheckedCrossEntropyLoss'),
    ]
    rotated = [
        (MODELS, 'SafeGDLoss'),
        (MODELS, 'SafeRotatedIoULoss'),
        (TASK_UTILS, 'SafeDeltaXYWHTRBBoxCoder'),
        (TASK_UTILS, 'SinCosAngleCoder'),
    ]
    if 'mmrotate' in present:
        core += rotated
        rotated = []
    for registry, name in core:
        check(isinstance(registry.get(name), type), f'{name} is registered')
    for registry, name in rotated:
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
    for name in NEEDS_SCAN:
        result = run(['mmnanguard-check-dataset', osp.join(folder, name)])
        text = str(result['err']) + str(result['out'])
        expected = NEEDS_MMROTATE[name][1]
        check(
            result['rc'] == 2 and expected in text and 'Traceback' not in text,
            f'mmnanguard-check-dataset {name}: exit {result["rc"]}, names '
            'mmrotate, no traceback',
            text[-2000:],
        )


def main(argv: Sequence[str] = None) -> int:
    """Run every check; 0 when all pass, 1 otherwise."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--wheel', required=True, help='the built wheel')
    parser.add_argument('--source', required=True, help='its source tree')
    parser.add_argument('--stack', required=True, help='the stack name')
    parser.add_argument(
        '--present', nargs='*', default=[], help='packages the stack has'
    )
    parser.add_argument(
        '--absent', nargs='*', default=[], help='packages it must not have'
    )
    args = parser.parse_args(argv)
    folder = os.getcwd()
    print(
        f'[wheel-smoke] stack {args.stack}: present {args.present}, '
        f'absent {args.absent}',
        flush=True,
    )
    steps: List[Callable[[], None]] = [
        lambda: check_import(args.present),
        lambda: check_wheel_contents(args.wheel, args.source),
        lambda: check_registries(args.present),
        check_help,
        lambda: run_steps(folder, lambda name: name in args.present),
        lambda: check_analysis_tools(folder),
    ]
    if 'mmrotate' in args.absent:
        steps.append(lambda: check_needs_mmrotate(folder))
    for step in steps:
        step()
    if FAILURES:
        print(f'[wheel-smoke] {len(FAILURES)} check(s) FAILED:', flush=True)
        for what in FAILURES:
            print(f'[wheel-smoke] FAILED: {what}', flush=True)
        return 1
    print(f'[wheel-smoke] stack {args.stack}: all checks passed', flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
