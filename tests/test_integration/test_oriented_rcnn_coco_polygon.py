# Copyright (c) mmnanguard contributors. All rights reserved.
"""mmrotate's own Oriented R-CNN config for COCO-format polygons
(``oriented-rcnn-le90_r50_fpn_6x_ssdd.py``: mmdet's ``CocoDataset``, then
``ConvertMask2BoxType`` turns each polygon into a rotated box), shrunk, on
generated ships, one of whose polygons has collinear points (mmrotate#759).

Its ``bbox`` is a normal 40 x 20, so ``CocoDataset``'s filter keeps it;
the rotated box it becomes has width 0. Nothing is planted in the model:
the bare run's weights go NaN by themselves. The protected run, the user's
config plus the include, drops those steps, names the json and the
annotation id, keeps the smoothed log finite under mmrotate's own
``window_size=50``, and ends with a finite checkpoint; ``check_dataset``
names the same record before training."""

import glob
import json
import math
import os.path as osp
import re

import mmrotate
import pytest
import torch
from integration_utils import run_script
from mmengine.config import Config
from mmengine.registry import RUNNERS
from mmengine.runner import Runner
from mmengine.runner.checkpoint import CheckpointLoader

from mmnanguard.datagen import generate_coco
from mmnanguard.testing import tensors_all_finite
from mmnanguard.testing.shrink import (
    scale_image_sizes,
    shrink_model,
    shrink_runtime,
)

pytestmark = pytest.mark.slow

UPSTREAM = osp.join(
    osp.dirname(mmrotate.__file__),
    '.mim',
    'configs',
    'oriented_rcnn',
    'oriented-rcnn-le90_r50_fpn_6x_ssdd.py',
)
#: the polygon's points lie on one line; its declared bbox is 40 x 20
X, Y = 60.0, 80.0
COLLINEAR = [X, Y, X + 10, Y + 5, X + 30, Y + 15, X + 40, Y + 20]


@pytest.fixture(scope='module')
def ships(tmp_path_factory):
    """4 images of one class, ``ship`` (the config's); image 2's first
    annotation is the collinear polygon."""
    root = str(tmp_path_factory.mktemp('coco_polygons'))
    ann_file = generate_coco(root, num_images=4, seed=0)['ann_file']
    with open(ann_file) as f:
        coco = json.load(f)
    for record in coco['annotations']:
        record['category_id'] = 1
    coco['categories'] = [dict(id=1, name='ship')]
    bad = next(a for a in coco['annotations'] if a['image_id'] == 2)
    bad.update(bbox=[X, Y, 40.0, 20.0], area=800.0, segmentation=[COLLINEAR])
    with open(ann_file, 'w') as f:
        json.dump(coco, f)
    (image,) = [i['file_name'] for i in coco['images'] if i['id'] == 2]
    return dict(root=root, ann_file=ann_file, ann_id=bad['id'], image=image)


def _reports(work_dir):
    """Each incident's ``report.json``, oldest first, with its
    ``report.md`` text as ``markdown``."""
    reports = []
    for path in sorted(glob.glob(osp.join(work_dir, 'nanguard', '*'))):
        with open(osp.join(path, 'report.json')) as f:
            reports.append(json.load(f))
        with open(osp.join(path, 'report.md')) as f:
            reports[-1]['markdown'] = f.read()
    return reports


def _data_lines(root):
    return (
        'train_dataloader = dict(dataset=dict('
        f"data_root={root + '/'!r}, "
        "ann_file='annotations/instances.json', "
        "data_prefix=dict(img='images/')))\n"
    )


def _config(tmp_path, ships, guarded):
    """The user's config: upstream's, the include when ``guarded``, the
    data paths."""
    bases = [UPSTREAM] + (
        ['mmnanguard::_base_/nanguard.py'] if guarded else []
    )
    path = tmp_path / ('guarded.py' if guarded else 'bare.py')
    path.write_text(f'_base_ = {bases!r}\n' + _data_lines(ships['root']))
    return str(path)


def _shrunk(config, work_dir, max_iters):
    cfg = Config.fromfile(config)
    upstream_log = dict(cfg.log_processor)
    # mmrotate's default_runtime smooths the log over 50 iterations
    assert upstream_log['window_size'] == 50
    shrink_model(cfg.model)
    scale_image_sizes([cfg.train_dataloader.dataset.pipeline], cfg.model, 256)
    shrink_runtime(cfg, work_dir, max_iters=max_iters)
    # shrink_runtime logs every iteration alone; keep upstream's window
    cfg.log_processor = dict(upstream_log, by_epoch=False)
    return cfg


def test_the_bare_run_goes_nan_by_itself(ships, tmp_path):
    cfg = _shrunk(_config(tmp_path, ships, False), str(tmp_path / 'w'), 2)
    runner = Runner.from_cfg(cfg)
    runner.train()
    params = runner.model.parameters()
    assert not all(torch.isfinite(p).all() for p in params)


def test_the_protected_run_names_the_json_record_and_keeps_its_log_finite(
    ships, tmp_path
):
    work_dir = str(tmp_path / 'w')
    cfg = _shrunk(_config(tmp_path, ships, True), work_dir, 4)
    runner = RUNNERS.build(cfg)
    runner.train()
    assert runner.iter == 4
    ckpt = CheckpointLoader.load_checkpoint(
        osp.join(work_dir, 'iter_4.pth'), map_location='cpu'
    )
    assert tensors_all_finite(ckpt['state_dict'])
    assert tensors_all_finite(ckpt['optimizer'])

    reports = _reports(work_dir)
    # the image is in both epochs of 2 iterations: one dropped step each
    assert len(reports) == 2
    scalars = runner.message_hub.log_scalars
    assert scalars['train/nanguard_skipped'].current() == 2
    first = reports[0]
    assert first['kind'] == 'nonfinite_loss' and first['action'] == 'skip'
    assert first['cause'] == 'data' and first['stage'] == 'loss'
    (finding,) = first['evidence']['data']
    assert finding['check'] == 'rbox_size'
    assert finding['annfile'] == ships['ann_file']
    assert finding['ann_id'] == ships['ann_id']
    verdict = first['markdown'].splitlines()[2]
    assert (
        f"annotations/instances.json annotation id {ships['ann_id']} "
        f"(image {ships['image']})"
    ) in verdict
    assert 'zero-size rotated box' in verdict
    assert (
        f"{ships['ann_file']} annotation id {ships['ann_id']}"
        in first['diagnosis']['remedy'][0]
    )

    # every logged mean after a dropped step is finite (window 50)
    (log,) = glob.glob(osp.join(work_dir, '*', '*.log'))
    with open(log) as f:
        lines = [ln for ln in f if 'Iter(train)' in ln]
    assert len(lines) == 4
    for line in lines[1:]:
        values = re.findall(r' (loss\w*|grad_norm): (\S+)', line)
        assert values, line
        for name, value in values:
            assert math.isfinite(float(value)), (name, line)


def test_check_dataset_names_the_record_before_training(ships, tmp_path):
    out = tmp_path / 'scan.json'
    done = run_script(
        [
            'tools/check_dataset.py',
            _config(tmp_path, ships, True),
            '--no-progress',
            '--out',
            str(out),
        ]
    )
    assert done.returncode == 1, done.stderr  # problems found
    with open(out) as f:
        scan = json.load(f)
    sizes = [p for p in scan['problems'] if p['kind'] == 'rbox_size']
    assert len(sizes) == 1
    assert sizes[0]['file'] == ships['ann_file']
    assert sizes[0]['record'] == f"annotation id {ships['ann_id']}"
    assert sizes[0]['stage'] == 'ConvertMask2BoxType'
    # the collinear polygon's points, as one rotated box of width 0
    cx, cy, w, h, _ = sizes[0]['values']
    assert (cx, cy, w) == (X + 20, Y + 10, 0)
    assert h == pytest.approx(math.hypot(40, 20))
