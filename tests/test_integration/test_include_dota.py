# Copyright (c) mmnanguard contributors. All rights reserved.
"""The include on the unmodified upstream rotated RetinaNet (shrunk), with a
broken annotation in the data, under the default ``skip`` policy."""

import glob
import json
import os.path as osp
import uuid

import pytest
from integration_utils import NANGUARD_DOTA
from mmengine.config import Config
from mmengine.registry import RUNNERS
from mmengine.runner.checkpoint import CheckpointLoader

from mmnanguard.engine.hooks import NanGuardHook
from mmnanguard.engine.runner import NanGuardRunner
from mmnanguard.testing import tensors_all_finite


@pytest.mark.slow
def test_include_skips_broken_annotation(broken_dota, tmp_path):
    cfg = Config.fromfile(NANGUARD_DOTA)
    # the include only adds these two keys; custom_hooks stays upstream's
    assert cfg.runner_type == 'mmnanguard.NanGuardRunner'
    assert cfg.nanguard.policy == 'skip'
    assert cfg.optim_wrapper.clip_grad == dict(max_norm=35, norm_type=2)
    cfg.work_dir = str(tmp_path)
    cfg.experiment_name = f'include_dota_{uuid.uuid4().hex[:8]}'
    cfg.train_dataloader.dataset.data_root = broken_dota['root'] + '/'
    # 4 images, the broken one among them: 2 iterations per epoch, 2
    # epochs, a checkpoint after each (epoch-based loop)
    runner = RUNNERS.build(cfg)
    assert type(runner) is NanGuardRunner
    runner.train()

    assert runner.iter == 4 and runner.epoch == 2
    guard = next(h for h in runner.hooks if isinstance(h, NanGuardHook))
    # P0000 is in every epoch: one incident per epoch, each skipped
    assert guard.counters['incidents'] == 2
    assert guard.counters['skipped'] == 2
    assert guard.counters['rollbacks'] == 0
    reports = sorted(
        glob.glob(str(tmp_path / 'nanguard' / '*' / 'report.json'))
    )
    assert len(reports) == 2
    for path in reports:
        with open(path) as f:
            report = json.load(f)
        assert report['kind'] == 'nonfinite_loss'
        assert report['action'] == 'skip'
        assert 'loss_bbox' in report['nonfinite_terms']
        samples = [s['img_path'] for s in report['samples']]
        assert broken_dota['image'] in samples, samples
    checkpoints = sorted(glob.glob(str(tmp_path / 'epoch_*.pth')))
    assert [osp.basename(c) for c in checkpoints] == [
        'epoch_1.pth',
        'epoch_2.pth',
    ]
    for path in checkpoints:
        ckpt = CheckpointLoader.load_checkpoint(path, map_location='cpu')
        assert tensors_all_finite(ckpt['state_dict']), path
        assert tensors_all_finite(ckpt['optimizer']), path
    # the data check named the same file (and the line's problem) first
    log = open(glob.glob(str(tmp_path / '*' / '*.log'))[0]).read()
    assert (
        f'ValidateAnnotations(policy=warn): kept {broken_dota["image"]}' in log
    )
    assert 'rbox_size failed' in log
