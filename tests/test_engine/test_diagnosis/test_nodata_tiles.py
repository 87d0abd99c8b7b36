# Copyright (c) mmnanguard contributors. All rights reserved.
"""Float32 tiles with GDAL's NoData value (-3.4e38, finite) on the tiny
mmseg FCN, nothing else planted.

A bare run overflows BatchNorm's ``running_var`` to inf in the forward
while the loss stays finite, and writes it into its checkpoint. The
protected run catches the buffer in the iteration that writes it, restores
it with the skip (no rollback), names the tile, the count of NoData pixels
and the value, says ``forward`` and ``data``, and calls the tile's return
a repeat; ``check_dataset`` finds the tile before training.
"""

import importlib.util
import json
import math
import os.path as osp

import cv2
import numpy as np
import pytest
import torch
from diagnosis_helpers import read_reports
from mmengine.runner import Runner

from mmnanguard.datagen import generate_cityscapes
from mmnanguard.engine.incident.allowlist import load_batch
from mmnanguard.testing import load_tiny_config

REPO = osp.dirname(osp.dirname(osp.dirname(osp.dirname(__file__))))
BARE = osp.join(REPO, 'configs', 'tiny', 'fcn_r18-d8_tiny-cityscapes.py')
GUARDED = osp.join(
    REPO, 'configs', 'nanguard', 'fcn_r18-d8_nanguard_tiny-cityscapes.py'
)
NODATA = -3.4e38
#: What a float32 tile holds of it.
NODATA_F32 = float(np.float32(NODATA))
#: Its square passes float32 (the check's bound, computed here in float64).
EXTREME = math.sqrt(float(np.finfo(np.float32).max))
MAX_ITERS = 6


def extreme_pixels(img) -> int:
    return int((np.abs(np.asarray(img, np.float64)) >= EXTREME).sum())


@pytest.fixture(scope='module')
def nodata_root(tmp_path_factory):
    """A generated Cityscapes folder whose second image is a float32 TIFF
    (under its png name, as a tile export might) with a NoData block."""
    root = str(tmp_path_factory.mktemp('nodata'))
    written = generate_cityscapes(root, num_images=4, seed=0)
    tile = sorted(written['images'])[1]
    img = cv2.imread(tile).astype(np.float32)
    img[:40, :60] = NODATA
    ok, data = cv2.imencode('.tiff', img)
    assert ok
    with open(tile, 'wb') as f:
        f.write(data.tobytes())
    return root, tile


def _cfg(path, root, work_dir):
    cfg = load_tiny_config(path, str(work_dir), root, max_iters=MAX_ITERS)
    pipeline = cfg.train_dataloader.dataset.pipeline
    pipeline[0] = dict(type='LoadImageFromFile', color_type='unchanged')
    cfg.train_dataloader.batch_size = 2
    return cfg


def _checkpoint_state(work_dir):
    ckpt = torch.load(
        osp.join(work_dir, f'iter_{MAX_ITERS}.pth'),
        map_location='cpu',
        weights_only=False,
    )
    return ckpt['state_dict']


@pytest.fixture(scope='module')
def guarded_run(nodata_root, tmp_path_factory):
    root, _ = nodata_root
    work_dir = str(tmp_path_factory.mktemp('guarded'))
    runner = Runner.from_cfg(_cfg(GUARDED, root, work_dir))
    runner.train()
    return runner, work_dir, read_reports(work_dir)


def test_bare_training_writes_the_overflow_into_its_checkpoint(
    nodata_root, tmp_path
):
    root, _ = nodata_root
    runner = Runner.from_cfg(_cfg(BARE, root, tmp_path))
    runner.train()
    state = _checkpoint_state(str(tmp_path))
    bad = [
        k
        for k, v in state.items()
        if v.is_floating_point() and not torch.isfinite(v).all()
    ]
    assert 'backbone.stem.1.running_var' in bad


def test_the_buffer_is_restored_with_the_skip(guarded_run):
    runner, work_dir, reports = guarded_run
    counters = runner.message_hub.log_scalars
    incidents = counters['train/nanguard_incidents'].current()
    assert incidents == len(reports) >= 1
    assert counters['train/nanguard_nonfinite_buffers'].current() == incidents
    assert counters['train/nanguard_rollbacks'].current() == 0
    assert counters['train/nanguard_nonfinite_params'].current() == 0
    assert runner.iter == MAX_ITERS
    for state in (runner.model.state_dict(), _checkpoint_state(work_dir)):
        for key, value in state.items():
            if value.is_floating_point():
                assert torch.isfinite(value).all(), key
    for report in reports:
        assert report['kind'] == 'nonfinite_buffers'
        assert report['action'] == 'skip' and report['stage'] == 'forward'
        assert 'backbone.stem.1.running_var' in report['restored_buffers']


def test_the_report_names_the_tile_its_pixels_and_the_cause(
    guarded_run, nodata_root
):
    _, _, reports = guarded_run
    _, tile = nodata_root
    first = reports[0]
    assert first['cause'] == 'data' and first['reproduced'] is True
    (finding,) = first['evidence']['data']
    assert finding['check'] == 'image_range'
    assert finding['img_path'] == tile
    # independent count: the tile's pixels in the batch the loader gave
    batch = load_batch(osp.join(first['folder'], 'batch.pth'))
    image = batch['data_batch']['inputs'][finding['sample']]
    assert finding['values'] == [extreme_pixels(image), NODATA_F32]
    assert 0 < finding['values'][0] <= 40 * 60 * 3
    assert first['evidence']['replay']['nonfinite_buffers']
    assert osp.basename(tile) in first['diagnosis']['summary']
    assert 'inputs finite' in first['live']['text']
    assert 'NoData' in first['markdown']
    for later in reports[1:]:  # the tile comes back: a repeat, not new
        assert later['repeat_of']['folder'] == osp.basename(first['folder'])
        assert later['repeat_of']['cause'] == 'data'


def test_check_dataset_finds_the_tile_before_training(nodata_root, tmp_path):
    root, tile = nodata_root
    config = tmp_path / 'cfg.py'
    config.write_text(
        f'_base_ = [{BARE!r}]\n'
        f'train_dataloader = dict(dataset=dict(data_root={root!r} + "/", '
        "pipeline=[dict(type='LoadImageFromFile', color_type='unchanged'),"
        " dict(type='LoadAnnotations'), dict(type='PackSegInputs')]))\n"
    )
    out = tmp_path / 'report.json'
    spec = importlib.util.spec_from_file_location(
        'check_dataset', osp.join(REPO, 'tools', 'check_dataset.py')
    )
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    code = tool.main([str(config), '--no-progress', '--out', str(out)])
    assert code == 1
    (problem,) = json.loads(out.read_text())['problems']
    expected = extreme_pixels(cv2.imread(tile, cv2.IMREAD_UNCHANGED))
    assert expected == 40 * 60 * 3
    assert problem['kind'] == 'image_range' and problem['file'] == tile
    assert problem['values'] == [expected, NODATA_F32]
