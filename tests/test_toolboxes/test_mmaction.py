# Copyright (c) mmnanguard contributors. All rights reserved.
"""mmaction2 (video action recognition), a toolbox none of the tools was
written for: TSN (``Recognizer2D``) and SlowOnly (``Recognizer3D``)
model-zoo configs, shrunk to ResNet-18 widths, on generated videos in the
zoo's own list format (``VideoDataset``, ``DecordInit``), through the
include with a NaN gradient planted at iteration 1; then every tool on the
same configs: the replay line the report gives, ``check_dataset``,
``check_loss`` and the doctor.

mmaction2's ``PackActionInputs`` keeps no metainfo key that names the
video (``filename``): the report names the batch's videos only because
the runner's datasets keep each sample's origin
(:class:`~mmnanguard.engine.incident.sample_origin.KeepSampleOrigin`).
"""

import json
import os
import os.path as osp

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mmengine.config import Config
from stack_marks import needs_mmaction
from toolbox_runs import (
    check_protected_run,
    load_tool,
    train_protected,
    upstream_config,
)

pytestmark = [pytest.mark.stack_smoke, needs_mmaction]

TSN = (
    'recognition/tsn/tsn_imagenet-pretrained-r50_8xb32-1x1x3-100e_'
    'kinetics400-rgb.py'
)
SLOWONLY = (
    'recognition/slowonly/slowonly_imagenet-pretrained-r50_8xb16-4x16x1-'
    'steplr-150e_kinetics400-rgb.py'
)
#: Generated clips: their count, frames, and their side in pixels.
CLIPS, FRAMES, WIDTH, HEIGHT = 6, 12, 80, 60
#: The short side the shrunk pipelines resize to, and their crop.
SHORT_SIDE, CROP = 64, 56


def write_video_set(root):
    """Videos of random pixels and the list file of mmaction2's
    ``VideoDataset`` (one ``name label`` line per video).

    Returns:
        list[str]: The video paths, in list order.
    """
    os.makedirs(osp.join(root, 'videos'), exist_ok=True)
    rng = np.random.default_rng(0)
    lines, paths = [], []
    for i in range(CLIPS):
        name = f'clip_{i}.mp4'
        path = osp.join(root, 'videos', name)
        writer = cv2.VideoWriter(
            path, cv2.VideoWriter_fourcc(*'mp4v'), 10, (WIDTH, HEIGHT)
        )
        for _ in range(FRAMES):
            writer.write(
                rng.integers(0, 255, size=(HEIGHT, WIDTH, 3), dtype=np.uint8)
            )
        writer.release()
        lines.append(f'{name} {i % 4}')
        paths.append(path)
    with open(osp.join(root, 'train_list_videos.txt'), 'w') as f:
        f.write('\n'.join(lines) + '\n')
    return paths


@pytest.fixture(scope='module')
def video_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('tiny_videos'))
    write_video_set(root)
    return root


def shrink_recognizer(data_root):
    """ResNet-18 (2D or 3D) without pretrained weights, its head to
    match, the generated videos, and the pipeline's 256-px resize and
    224-px crops at :data:`SHORT_SIDE` and :data:`CROP`."""

    def shrink(cfg):
        cfg.model.backbone.update(depth=18, pretrained=None)
        if 'pretrained2d' in cfg.model.backbone:
            cfg.model.backbone.pretrained2d = False
        cfg.model.cls_head.in_channels = 512
        dataset = cfg.train_dataloader.dataset
        dataset.ann_file = osp.join(data_root, 'train_list_videos.txt')
        dataset.data_prefix = dict(video=osp.join(data_root, 'videos'))
        for transform in dataset.pipeline:
            if transform['type'] == 'Resize':
                small = transform['scale'] == (-1, 256)
                transform['scale'] = (
                    (-1, SHORT_SIDE) if small else (CROP, CROP)
                )
            if transform['type'] == 'MultiScaleCrop':
                transform['input_size'] = CROP

    return shrink


def _protected(tmp_path, video_root, relative):
    run = train_protected(
        tmp_path,
        upstream_config('mmaction', relative),
        shrink_recognizer(video_root),
        path_key='filename',
    )
    report = check_protected_run(run)
    # the videos, by the field of the data info that names them
    assert report['samples'], report
    for sample in report['samples']:
        assert sample['path_field'] == 'filename'
        assert sample['img_path'].startswith(
            osp.join(video_root, 'videos', 'clip_')
        )
    with open(osp.join(report['folder'], 'report.md')) as f:
        text = f.read()
    names = ', '.join(
        f'{osp.basename(p)} (filename)' for p in run['batch_files']
    )
    assert f'- batch: {names}\n' in text
    return run, report


def test_tsn_protected(tmp_path, video_root):
    run, _ = _protected(tmp_path, video_root, TSN)
    model = run['runner'].model
    assert type(model).__name__ == 'Recognizer2D'
    assert model.backbone.depth == 18


def test_slowonly_protected(tmp_path, video_root):
    run, _ = _protected(tmp_path, video_root, SLOWONLY)
    model = run['runner'].model
    assert type(model).__name__ == 'Recognizer3D'
    assert type(model.backbone).__name__ == 'ResNet3dSlowOnly'


def test_replay_from_the_reports_line(tmp_path, video_root, capsys):
    """``tools/replay.py INCIDENT --config CFG``, as ``report.md`` gives
    it: the batch file (mmaction2's ``ActionDataSample`` and its
    ``LabelData``) loads and the replay of the planted fault is finite."""
    run, report = _protected(tmp_path, video_root, TSN)
    text = open(osp.join(report['folder'], 'report.md')).read()
    assert 'python tools/replay.py INCIDENT_DIR --config CFG' in text
    cfg = run['runner'].cfg.copy()
    cfg.custom_hooks = [
        h for h in cfg.custom_hooks if h['type'] != 'FaultInjectionHook'
    ]
    config = str(tmp_path / 'replay_config.py')
    cfg.dump(config)
    capsys.readouterr()
    code = load_tool('replay').main([report['folder'], '--config', config])
    out = capsys.readouterr().out
    assert code == 0, out
    assert 'replay (fp32): finite' in out
    assert 'Refusing' not in out


def _shrunk_config(tmp_path, video_root, relative):
    cfg = Config.fromfile(upstream_config('mmaction', relative))
    shrink_recognizer(video_root)(cfg)
    path = str(tmp_path / osp.basename(relative))
    cfg.dump(path)
    return path


def test_check_dataset_reads_the_videos(tmp_path, video_root, capsys):
    """Every video through TSN's pipeline: no problem, and the label
    range it cannot check (mmaction2's metainfo has no classes) said."""
    config = _shrunk_config(tmp_path, video_root, TSN)
    out = str(tmp_path / 'scan.json')
    code = load_tool('check_dataset').main(
        [config, '--no-progress', '--out', out]
    )
    stdout = capsys.readouterr().out
    assert code == 0, stdout
    with open(out) as f:
        report = json.load(f)
    assert report['problems'] == []
    assert f'VideoDataset (train): {CLIPS} samples' in stdout
    assert 'Not checked: label and segmentation value ranges: ' in stdout


def test_check_loss_finds_the_heads_own_loss(tmp_path, capsys):
    """TSN's config writes no loss: ``TSNHead`` builds its default
    ``CrossEntropyLoss`` (mmaction2's own). ``check_loss`` finds it in the
    built model, with the head's 400 classes; the cases whose keyword
    arguments it does not take are not applicable, and the one failing
    case is the one where torch's cross-entropy itself is NaN."""
    out = str(tmp_path / 'tsn.json')
    code = load_tool('check_loss').main(
        [upstream_config('mmaction', TSN), '--json', out]
    )
    stdout = capsys.readouterr().out
    with open(out) as f:
        (report,) = json.load(f)
    assert report['path'] == 'model.cls_head.loss_cls'
    assert report['loss_type'] == 'CrossEntropyLoss'
    assert report['kind'] == 'classification'
    by_case = {r['case']: r for r in report['results']}
    assert by_case['labels = num_classes (400)']['verdict'] == 'rejected'
    for case in ('avg_factor=0', "reduction 'none'", "reduction 'sum'"):
        assert by_case[case]['verdict'] == 'n/a', by_case[case]
        assert 'the loss takes no argument' in by_case[case]['message']
    failing = [r['case'] for r in report['results'] if not r['passed']]
    assert failing == ['no targets (0 samples)']
    # torch's own mean over no sample
    empty = F.cross_entropy(torch.zeros(0, 400), torch.zeros(0).long())
    assert torch.isnan(empty)
    assert code == 1, stdout


@pytest.mark.parametrize(
    'gpus, expected',
    [
        # 8 GPUs x 32 = the 256 the config's lr was set for
        (8, []),
        # one GPU: 32 of 256, lr 0.01 -> 0.00125 by SGD's linear scaling
        (1, ['lr-above-linear-scaling']),
    ],
)
def test_doctor_on_tsn(tmp_path, gpus, expected):
    out = str(tmp_path / 'doctor.json')
    load_tool('doctor').main(
        [upstream_config('mmaction', TSN), '--gpus', str(gpus), '--json', out]
    )
    with open(out) as f:
        found = json.load(f)['findings']
    rules = [f['rule'] for f in found if f['rule'].startswith('lr-')]
    assert rules == expected, found
    if expected:
        (lr,) = [f for f in found if f['rule'] == expected[0]]
        assert '0.00125' in lr['message'] and '8x too high' in lr['message']
    # the one other finding is true of the config: MultiStepLR alone
    others = [f['rule'] for f in found if not f['rule'].startswith('lr-')]
    assert others == ['no-warmup'], found
