# Copyright (c) mmnanguard contributors. All rights reserved.
"""The training runs of ``tools/setup/wheel_smoke.py``: a user's own configs,
written into the user's project folder, protected through ``mmnanguard::``.

Each :class:`Case` is a config that a user of that toolbox would write on
top of the stack's own upstream config (RetinaNet and rotated RetinaNet
directly, FCN through the shipped ``mmnanguard::tiny/...`` config, an
upstream config shrunk for the CPU), 2 iterations on generated data with
a NaN gradient planted at iteration 1 by ``FaultInjectionHook`` (a
test/drill helper, which the config's ``custom_imports`` registers by
importing ``mmnanguard.testing``).
:func:`check_run` trains it with ``mmnanguard-train`` and checks the
incident, the skipped step and the checkpoint; :func:`check_resume`
resumes it to iteration 4.
"""

import glob
import json
import os
import os.path as osp
import subprocess
import sys
import time
from typing import Callable, Dict, List, NamedTuple, Sequence

#: What every case appends: 2 iterations, a checkpoint at 2, the fault
#: (``FaultInjectionHook`` is registered only by ``mmnanguard.testing``).
RUN_SETTINGS = """
train_cfg = dict(
    _delete_=True, type='IterBasedTrainLoop', max_iters=2, val_interval=100
)
param_scheduler = []
val_cfg = val_dataloader = val_evaluator = None
test_cfg = test_dataloader = test_evaluator = None
default_hooks = dict(
    logger=dict(interval=1),
    checkpoint=dict(
        _delete_=True, type='CheckpointHook', interval=2, by_epoch=False
    ),
    visualization=dict(draw=False),
)
log_processor = dict(window_size=1, by_epoch=False)
randomness = dict(seed=0)
custom_imports = dict(
    imports=['mmnanguard.testing'], allow_failed_imports=False
)
custom_hooks = [dict(type='FaultInjectionHook', fault='nan_grad', iteration=1)]
"""

RETINANET = """\
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
"""

FCN = """\
_base_ = [
    'mmnanguard::tiny/fcn_r18-d8_tiny-cityscapes.py',
    'mmnanguard::_base_/{include}.py',
]
train_dataloader = dict(batch_size=2, dataset=dict(data_root={data_root!r}))
"""

ROTATED_RETINANET = """\
_base_ = [
    'mmrotate::rotated_retinanet/rotated-retinanet-rbox-le90_r50_fpn_1x_dota.py',
    'mmnanguard::_base_/{include}.py',
]
data_root = {data_root!r}
model = dict(
    backbone=dict(depth=18, init_cfg=None),
    neck=dict(in_channels=[64, 128, 256, 512], out_channels=64),
    bbox_head=dict(in_channels=64, feat_channels=64),
)
train_dataloader = dict(
    batch_size=2,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(
        data_root=data_root,
        pipeline=[
            dict(type='mmdet.LoadImageFromFile'),
            dict(
                type='mmdet.LoadAnnotations', with_bbox=True, box_type='qbox'
            ),
            dict(
                type='ConvertBoxType', box_type_mapping=dict(gt_bboxes='rbox')
            ),
            dict(type='mmdet.Resize', scale=(256, 256), keep_ratio=True),
            dict(type='mmdet.RandomFlip', prob=0.5),
            dict(type='mmdet.PackDetInputs'),
        ],
    ),
)
"""


class Case(NamedTuple):
    """One user config of the smoke run.

    Attributes:
        name (str): The config's file stem, e.g. ``'user_retinanet'``.
        text (str): The config, with ``{include}`` and ``{data_root}``.
        data (str): The generated data set: ``'coco'``, ``'cityscapes'``
            or ``'dota'``.
        needs (str): The optional package the case needs, or ``''``.
    """

    name: str
    text: str
    data: str
    needs: str = ''


DETECTOR = Case('user_retinanet', RETINANET, 'coco')
SEGMENTER = Case('user_fcn', FCN, 'cityscapes', 'mmseg')
ROTATED = Case('user_rotated_retinanet', ROTATED_RETINANET, 'dota', 'mmrotate')
CASES = (DETECTOR, SEGMENTER, ROTATED)

FAILURES: List[str] = []


def check(ok: bool, what: str, detail: str = '') -> bool:
    """Record ``what`` as failed unless ``ok``; print the outcome, with
    ``detail`` (e.g. the end of a command's stderr) only on failure."""
    print(f'[wheel-smoke] {"ok" if ok else "FAILED"}: {what}', flush=True)
    if not ok:
        FAILURES.append(what)
        if detail:
            print(detail, flush=True)
    return ok


def run(argv: Sequence[str], timeout: float = 900) -> Dict[str, object]:
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


def generated_data(folder: str, kind: str) -> str:
    """The generated data set ``kind`` under ``folder/data`` (made once)."""
    from mmnanguard import datagen

    root = osp.join(folder, 'data', f'tiny_{kind}', '')
    if not osp.isdir(root):
        if kind == 'coco':
            datagen.generate_coco(root, num_images=4, img_size=128, seed=0)
        elif kind == 'dota':
            datagen.generate_dota(root, num_images=4, seed=0)
        else:
            datagen.generate_cityscapes(root, num_images=4, seed=0)
    return root


def write_config(folder: str, case: Case, include: str = 'nanguard') -> str:
    """Write ``case`` with ``mmnanguard::_base_/INCLUDE.py``; its path."""
    stem = case.name if include == 'nanguard' else f'{case.name}_{include}'
    path = osp.join(folder, f'{stem}.py')
    text = case.text.format(
        include=include, data_root=generated_data(folder, case.data)
    )
    with open(path, 'w') as f:
        f.write(text + RUN_SETTINGS)
    return path


def incident_reports(work_dir: str) -> List[dict]:
    """The ``report.json`` of every incident under ``work_dir``."""
    reports = []
    pattern = osp.join(work_dir, 'nanguard', 'incident_*', 'report.json')
    for path in sorted(glob.glob(pattern)):
        with open(path) as f:
            reports.append(json.load(f))
    return reports


def check_checkpoint(path: str, iteration: int) -> None:
    """``path`` exists, is at ``iteration``, has finite weights and
    counts the one planted incident, skipped."""
    from mmengine.runner import CheckpointLoader

    from mmnanguard.testing import tensors_all_finite

    if not check(osp.isfile(path), f'checkpoint {path} written'):
        return
    state = CheckpointLoader.load_checkpoint(path, map_location='cpu')
    check(
        tensors_all_finite(state['state_dict']),
        f'every weight in {osp.basename(path)} is finite',
    )
    seen = state.get('meta', {}).get('iter')
    check(
        seen == iteration,
        f'the checkpoint is at iteration {iteration} ' f'({seen})',
    )
    counters = state.get('nanguard', {}).get('counters', {})
    seen = {k: counters.get(k) for k in ('incidents', 'skipped')}
    check(
        seen == dict(incidents=1, skipped=1),
        f'the checkpoint counts 1 incident and 1 skipped step ({seen})',
    )


def check_run(
    folder: str, case: Case, include: str = 'nanguard', swap: str = ''
) -> str:
    """Train ``case`` 2 iterations and check the planted NaN gradient.

    Args:
        folder (str): The user's project folder.
        case (Case): The user config.
        include (str): ``nanguard`` or ``safe_modules``
            (``mmnanguard::_base_/INCLUDE.py``).
        swap (str): A module swap the run must log, e.g.
            ``'FocalLoss -> StableFocalLoss'``.

    Returns:
        str: The run's work dir.
    """
    config = write_config(folder, case, include)
    name = osp.basename(config)
    work_dir = osp.join(folder, 'work_dirs', osp.splitext(name)[0])
    result = run(['mmnanguard-train', config, '--work-dir', work_dir])
    if not check(
        result['rc'] == 0,
        f'mmnanguard-train {name} (mmnanguard::_base_/{include}.py) trains '
        f'2 iterations: exit {result["rc"]} in {result["seconds"]:.1f} s',
        str(result['err'])[-4000:],
    ):
        return work_dir
    if swap:
        text = str(result['out']) + str(result['err'])
        check(swap in text, f'the run logs the module swap {swap!r}')
    reports = incident_reports(work_dir)
    seen = [
        {k: r.get(k) for k in ('kind', 'iteration', 'action')} for r in reports
    ]
    check(
        seen == [dict(kind='nonfinite_grad', iteration=1, action='skip')],
        f'{name}: one incident, the planted NaN gradient at iteration 1, '
        f'skipped ({seen})',
    )
    check_checkpoint(osp.join(work_dir, 'iter_2.pth'), 2)
    return work_dir


def check_resume(folder: str, case: Case) -> None:
    """Resume the 2-iteration run of ``case`` to iteration 4: it starts
    at 2 (no new fault), and ``iter_4.pth`` still counts the one incident
    and skip of the first run."""
    config = osp.join(folder, f'{case.name}.py')
    work_dir = osp.join(folder, 'work_dirs', case.name)
    result = run(
        [
            'mmnanguard-train',
            config,
            '--work-dir',
            work_dir,
            '--resume',
            '--cfg-options',
            'train_cfg.max_iters=4',
        ]
    )
    text = str(result['out']) + str(result['err'])
    if not check(
        result['rc'] == 0 and 'resumed' in text.lower(),
        f'mmnanguard-train {case.name}.py --resume: exit {result["rc"]}, '
        f'resumed from iter_2.pth, in {result["seconds"]:.1f} s',
        str(result['err'])[-4000:],
    ):
        return
    check(
        len(incident_reports(work_dir)) == 1,
        'the resumed run adds no incident',
    )
    check_checkpoint(osp.join(work_dir, 'iter_4.pth'), 4)


def run_steps(folder: str, available: Callable[[str], bool]) -> None:
    """Every training check whose packages are installed: each case with
    the plain include, the detector with ``safe_modules.py`` and its
    resume."""
    for case in CASES:
        if case.needs and not available(case.needs):
            print(
                f'[wheel-smoke] skipped: {case.name} ({case.needs} is '
                'not part of this stack)',
                flush=True,
            )
            continue
        check_run(folder, case)
    check_run(folder, DETECTOR, 'safe_modules', 'FocalLoss -> StableFocalLoss')
    check_resume(folder, DETECTOR)
