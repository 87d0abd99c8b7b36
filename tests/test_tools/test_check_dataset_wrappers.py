# Copyright (c) mmnanguard contributors. All rights reserved.
"""tools/check_dataset.py on a dataset inside the wrappers configs put
around it (mmengine's ``RepeatDataset``, ``ClassBalancedDataset`` and
``ConcatDataset``, mmdet's ``MultiImageMixDataset``): the datasets that
load are scanned, the planted box is found as it is without a wrapper (it
raised ``AttributeError: ... no attribute 'pipeline'`` before), and a
mixing pipeline is said to be left out."""

import copy
import json
import os.path as osp

import pytest
from mmengine.config import Config
from test_check_dataset import coco_with_negative_box, load_tool

from mmnanguard.testing import TINY_COCO_CONFIG


@pytest.fixture(scope='module')
def coco_root(tmp_path_factory):
    """The tiny COCO set with a box of negative x (annotation 999)."""
    root = str(tmp_path_factory.mktemp('coco'))
    written, _ = coco_with_negative_box(root)
    return root, written['ann_file']


def _wrapped(inner, wrapper):
    if wrapper == 'RepeatDataset':
        return dict(type='RepeatDataset', times=3, dataset=inner)
    if wrapper == 'ClassBalancedDataset':
        return dict(
            type='ClassBalancedDataset', oversample_thr=0.5, dataset=inner
        )
    if wrapper == 'ConcatDataset':
        return dict(type='ConcatDataset', datasets=[inner])
    # mosaic: the inner dataset loads, the wrapper mixes and packs
    mix = copy.deepcopy(inner)
    mix['pipeline'] = [
        t for t in inner['pipeline'] if t['type'].startswith('Load')
    ]
    return dict(
        type='MultiImageMixDataset',
        dataset=mix,
        pipeline=[
            dict(type='Mosaic', img_scale=(64, 64), pad_val=114.0),
            dict(type='PackDetInputs'),
        ],
    )


def _scan(tmp_path, root, wrapper):
    cfg = Config.fromfile(TINY_COCO_CONFIG)
    inner = cfg.train_dataloader.dataset.to_dict()
    inner['data_root'] = osp.join(root, '')
    if wrapper is not None:
        cfg.train_dataloader.dataset = _wrapped(inner, wrapper)
    else:
        cfg.train_dataloader.dataset = inner
    config = str(tmp_path / f'{wrapper}.py')
    cfg.dump(config)
    out = str(tmp_path / 'report.json')
    code = load_tool().main([config, '--out', out, '--no-progress'])
    with open(out) as f:
        return code, json.load(f)


@pytest.mark.parametrize(
    'wrapper',
    [
        'RepeatDataset',
        'ClassBalancedDataset',
        'ConcatDataset',
        'MultiImageMixDataset',
    ],
)
def test_the_wrapped_dataset_is_scanned(coco_root, tmp_path, wrapper):
    root, ann_file = coco_root
    code, plain = _scan(tmp_path, root, None)
    assert code == 1
    code, report = _scan(tmp_path, root, wrapper)
    assert code == 1
    assert report['dataset'] == wrapper
    # the dataset that loads, once (a repeat adds no other sample)
    assert report['datasets'] == [dict(type='CocoDataset', samples=3)]
    assert report['num_samples'] == 3
    assert report['problems'] == plain['problems']
    (problem,) = report['problems']
    assert (problem['kind'], problem['record']) == (
        'negative_coord',
        'annotation id 999',
    )
    assert osp.samefile(problem['file'], ann_file)
    mixing = [n for n in report['not_checked'] if 'own pipeline' in n]
    if wrapper == 'MultiImageMixDataset':
        (note,) = mixing
        assert note.startswith(
            "MultiImageMixDataset's own pipeline (Mosaic, PackDetInputs)"
        )
    else:
        assert mixing == []


def test_two_datasets_in_a_concat_are_both_scanned(coco_root, tmp_path):
    root, _ = coco_root
    cfg = Config.fromfile(TINY_COCO_CONFIG)
    inner = cfg.train_dataloader.dataset.to_dict()
    inner['data_root'] = osp.join(root, '')
    cfg.train_dataloader.dataset = dict(
        type='ConcatDataset', datasets=[inner, copy.deepcopy(inner)]
    )
    config = str(tmp_path / 'concat.py')
    cfg.dump(config)
    out = str(tmp_path / 'report.json')
    assert load_tool().main([config, '--out', out, '--no-progress']) == 1
    with open(out) as f:
        report = json.load(f)
    assert report['num_samples'] == 6
    assert [d['samples'] for d in report['datasets']] == [3, 3]
    # the same record, once per dataset that lists it
    assert [p['record'] for p in report['problems']] == [
        'annotation id 999'
    ] * 2
