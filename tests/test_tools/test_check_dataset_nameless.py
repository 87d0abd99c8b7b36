# Copyright (c) mmnanguard contributors. All rights reserved.
"""tools/check_dataset.py on a dataset whose metainfo names no classes (as
mmocr's ``OCRDataset`` and many custom ``BaseDataset`` subclasses): the
boxes are checked, the label range is said to be unchecked, and a clean
folder exits 0."""

import json
import os.path as osp
import textwrap

import mmcv
import numpy as np
import pytest
from test_check_dataset import load_tool

DATASET_MODULE = '''
from mmdet.registry import DATASETS
from mmengine.dataset import BaseDataset


@DATASETS.register_module(force=True)
class NamelessBoxDataset(BaseDataset):
    """mmengine's own annotation format; no METAINFO, so no classes."""
'''


def write_folder(root, boxes):
    """One 64x48 image per entry of ``boxes`` and the annotation file."""
    data_list = []
    for i, (bbox, label) in enumerate(boxes):
        name = f'{i:03d}.png'
        mmcv.imwrite(np.full((48, 64, 3), 100, np.uint8), osp.join(root, name))
        data_list.append(
            dict(
                img_path=name,
                instances=[dict(bbox=bbox, bbox_label=label, ignore_flag=0)],
            )
        )
    with open(osp.join(root, 'ann.json'), 'w') as f:
        json.dump(dict(metainfo=dict(), data_list=data_list), f)


def write_config(folder, root):
    path = osp.join(folder, 'nameless_cfg.py')
    with open(path, 'w') as f:
        f.write(
            textwrap.dedent(
                f"""
                default_scope = 'mmdet'
                custom_imports = dict(imports=['nameless_dataset'])
                train_dataloader = dict(
                    batch_size=1,
                    dataset=dict(
                        type='NamelessBoxDataset',
                        data_root={osp.join(root, '')!r},
                        ann_file='ann.json',
                        data_prefix=dict(img_path=''),
                        pipeline=[
                            dict(type='LoadImageFromFile'),
                            dict(type='LoadAnnotations', with_bbox=True),
                            dict(type='PackDetInputs'),
                        ],
                    ),
                )
                """
            )
        )
    return path


@pytest.fixture
def setup(tmp_path, monkeypatch):
    with open(tmp_path / 'nameless_dataset.py', 'w') as f:
        f.write(DATASET_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    root = tmp_path / 'data'
    root.mkdir()
    return load_tool(), str(root), write_config(str(tmp_path), str(root))


def scan(tool, cfg, out):
    code = tool.main([cfg, '--out', out, '--no-progress'])
    with open(out) as f:
        return code, json.load(f)


def test_clean_folder_exits_zero_and_says_what_is_unchecked(
    setup, tmp_path, capsys
):
    tool, root, cfg = setup
    # label 99 of no known class: not a problem where no class is named
    write_folder(root, [([4, 4, 30, 20], 0), ([10, 8, 50, 40], 99)])
    code, report = scan(tool, cfg, str(tmp_path / 'report.json'))
    assert code == 0, report['problems']
    assert report['num_samples'] == 2 and report['num_instances'] == 2
    assert report['problems'] == []
    assert report['not_checked'] == [
        'label and segmentation value ranges: '
        "NamelessBoxDataset.metainfo names no 'classes'"
    ]
    out = capsys.readouterr().out
    assert 'Not checked: label and segmentation value ranges' in out
    assert 'No problems found.' in out


def test_a_zero_width_box_is_found_with_its_file(setup, tmp_path):
    tool, root, cfg = setup
    write_folder(root, [([4, 4, 30, 20], 0), ([12, 8, 12, 40], 0)])
    code, report = scan(tool, cfg, str(tmp_path / 'report.json'))
    assert code == 1
    files = {osp.basename(p['file']) for p in report['problems']}
    assert files == {'001.png'}
    assert all(p['instance'] == 0 for p in report['problems'])
