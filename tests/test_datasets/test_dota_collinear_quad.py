# Copyright (c) mmnanguard contributors. All rights reserved.
"""A user's DOTA quad whose four points lie on one line (a rotated box of
width 0): check_dataset and the training-time ValidateAnnotations both
name its annfile and line."""

import copy
import importlib.util
import json
import os.path as osp

import mmrotate  # noqa: F401
import numpy as np
import pytest
from mmengine.registry import DATASETS, init_default_scope

from mmnanguard.datagen import generate_dota
from mmnanguard.datasets.transforms.validate_annotations import (
    InvalidAnnotationError,
)
from mmnanguard.testing import TINY_DOTA_CONFIG
from mmnanguard.testing.tiny_configs import load_tiny_config

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def _collinear_line(class_name):
    # four distinct points on the line y = 100 + 0.5 (x - 100)
    xs = np.array([100.0, 110.0, 130.0, 150.0])
    ys = 100.0 + 0.5 * (xs - 100.0)
    points = ' '.join(f'{x:.1f} {y:.1f}' for x, y in zip(xs, ys))
    return f'{points} {class_name} 0'


@pytest.fixture(scope='module')
def dota_with_a_flat_quad(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('flat_dota'))
    written = generate_dota(root, num_images=4, seed=0)
    annfile = written['annfiles'][1]
    lines = open(annfile).read().splitlines()
    class_name = lines[0].split()[8]
    lines.insert(2, _collinear_line(class_name))  # line 3
    with open(annfile, 'w') as f:
        f.write('\n'.join(lines) + '\n')
    return root, annfile, written['images'][1]


def test_check_dataset_names_the_annfile_and_line(
    dota_with_a_flat_quad, tmp_path
):
    root, annfile, _ = dota_with_a_flat_quad
    spec = importlib.util.spec_from_file_location(
        'check_dataset', osp.join(REPO, 'tools', 'check_dataset.py')
    )
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    out = str(tmp_path / 'report.json')
    code = tool.main(
        [
            TINY_DOTA_CONFIG,
            '--out',
            out,
            '--no-progress',
            '--cfg-options',
            f'train_dataloader.dataset.data_root={osp.join(root, "")}',
        ]
    )
    assert code == 1
    with open(out) as f:
        problems = json.load(f)['problems']
    found = {(p['file'], p['line'], p['kind']) for p in problems}
    assert found == {(annfile, 3, 'qbox_area'), (annfile, 3, 'rbox_size')}


def test_training_time_validation_names_the_annfile_and_line(
    dota_with_a_flat_quad, tmp_path
):
    root, annfile, image = dota_with_a_flat_quad
    cfg = load_tiny_config(TINY_DOTA_CONFIG, str(tmp_path / 'work'), root)
    init_default_scope(cfg.default_scope)
    ds_cfg = copy.deepcopy(cfg.train_dataloader.dataset)
    ds_cfg.pipeline = list(cfg.train_pipeline)
    ds_cfg.pipeline.insert(
        len(ds_cfg.pipeline) - 1,
        dict(
            type='ValidateAnnotations',
            num_classes=15,
            angle_version='le90',
            policy='raise',
        ),
    )
    dataset = DATASETS.build(ds_cfg)
    idx = next(
        i
        for i in range(len(dataset))
        if dataset.get_data_info(i)['img_path'].endswith(osp.basename(image))
    )
    with pytest.raises(InvalidAnnotationError) as err:
        dataset[idx]
    message = str(err.value)
    assert 'rbox_size failed for instance 2' in message
    assert f'(annfile {annfile}, line 3)' in message
