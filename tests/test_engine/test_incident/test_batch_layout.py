# Copyright (c) mmnanguard contributors. All rights reserved.
"""The per-image records of a batch in mmdet's layout (a list of
``DetDataSample`` from mmengine's ``pseudo_collate``), built by mmdet's own
dataset and pipeline on generated COCO data; the dict layout of mmyolo is
tested on the ``toolboxes`` stack (``tests/test_toolboxes``)."""

import json
import os.path as osp

import numpy as np
import pytest
import torch
from mmdet.datasets import CocoDataset
from mmengine.dataset import pseudo_collate
from mmengine.registry import DefaultScope

from mmnanguard.datagen import COCO_TINY_CLASSES
from mmnanguard.engine.diagnosis.batch_checks import check_batch
from mmnanguard.engine.guard.input_check import batch_tensors, finite_flag
from mmnanguard.engine.incident.batch_layout import (
    KeepSampleNames,
    sample_records,
    sample_sources,
)

pytestmark = pytest.mark.stack_smoke


@pytest.fixture(scope='module')
def mmdet_batch(tiny_coco_root):
    with DefaultScope.overwrite_default_scope('mmdet'):
        dataset = _dataset(tiny_coco_root)
    items = [dataset[0], dataset[1]]
    return dataset, items, pseudo_collate(items)


def _dataset(tiny_coco_root):
    return CocoDataset(
        data_root=tiny_coco_root,
        ann_file='annotations/instances.json',
        data_prefix=dict(img='images/'),
        metainfo=dict(classes=COCO_TINY_CLASSES),
        pipeline=[
            dict(type='LoadImageFromFile'),
            dict(type='LoadAnnotations', with_bbox=True),
            dict(type='Resize', scale=(256, 256), keep_ratio=True),
            dict(type='RandomFlip', prob=0.0),
            dict(type='PackDetInputs'),
        ],
    )


def coco_boxes(root, img_id):
    """The boxes of ``img_id`` read from the JSON file, as x1, y1, x2, y2."""
    with open(osp.join(root, 'annotations', 'instances.json')) as f:
        anns = json.load(f)['annotations']
    return np.array(
        [
            [a['bbox'][0], a['bbox'][1], a['bbox'][0] + a['bbox'][2],
             a['bbox'][1] + a['bbox'][3]]
            for a in anns
            if a['image_id'] == img_id
        ]
    )  # fmt: skip


def test_records_of_the_mmdet_layout(mmdet_batch, tiny_coco_root):
    dataset, _, batch = mmdet_batch
    records = sample_records(batch)
    assert len(records) == 2
    for i, record in enumerate(records):
        info = dataset.get_data_info(i)
        assert record['img_path'] == info['img_path']
        assert record['img_id'] == info['img_id']
        expected = coco_boxes(tiny_coco_root, info['img_id'])
        got = record['boxes'].tensor.numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-5)
        assert record['labels'].tolist() == [
            inst['bbox_label'] for inst in info['instances']
        ]
        assert record['class_labels'] is None and record['seg_map'] is None
    assert sample_sources(batch) == [
        dict(img_path=r['img_path'], img_id=r['img_id'], seg_map_path=None)
        for r in records
    ]


def test_a_list_layout_is_left_as_collated(mmdet_batch):
    _, items, batch = mmdet_batch
    again = KeepSampleNames(pseudo_collate)(items)
    assert isinstance(again['data_samples'], list)
    assert (
        sample_records(again)[1]['img_path']
        == batch['data_samples'][1].img_path
    )


def test_box_checks_and_input_flag_on_the_mmdet_layout(mmdet_batch):
    _, items, _ = mmdet_batch
    batch = pseudo_collate(items)
    sample = batch['data_samples'][1]
    sample.gt_instances.bboxes.tensor[0, 2] = (
        sample.gt_instances.bboxes.tensor[0, 0]
    )  # a zero-width box
    findings = check_batch(batch, num_classes=len(COCO_TINY_CLASSES))
    assert [(f['sample'], f['index'], f['check']) for f in findings] == [
        (1, 0, 'hbox_size')
    ]
    assert findings[0]['img_path'] == sample.img_path
    preprocessed = dict(
        inputs=torch.stack([i.float() for i in batch['inputs']]),
        data_samples=batch['data_samples'],
    )
    assert bool(finite_flag(batch_tensors(preprocessed)))
    sample.gt_instances.bboxes.tensor[0, 1] = float('nan')
    assert not bool(finite_flag(batch_tensors(preprocessed)))


def test_a_sample_without_img_path_is_named_by_its_file_field(tmp_path):
    """A toolbox that keeps its source under another field (a video's
    ``filename``, a restorer's ``gt_path``): the record takes the field
    that names an existing file, and says which one."""
    from mmengine.structures import BaseDataElement

    clip = tmp_path / 'clip_007.mp4'
    clip.write_bytes(b'\0')
    gt = tmp_path / 'gt'
    gt.mkdir()
    samples = [
        BaseDataElement(
            metainfo=dict(
                label_text='a walk',  # a string, not a file
                frame_dir=str(tmp_path / 'missing'),  # names nothing
                filename=str(clip),
            )
        ),
        BaseDataElement(metainfo=dict(gt_path=str(gt), scale=4)),
        BaseDataElement(
            metainfo=dict(img_path='kept.png', filename=str(clip))
        ),
        BaseDataElement(metainfo=dict(note='no file at all')),
    ]
    sources = sample_sources(dict(inputs=[0, 0, 0, 0], data_samples=samples))
    assert sources == [
        dict(
            img_path=str(clip),
            img_id=None,
            seg_map_path=None,
            path_field='filename',
        ),
        dict(
            img_path=str(gt),
            img_id=None,
            seg_map_path=None,
            path_field='gt_path',
        ),
        dict(img_path='kept.png', img_id=None, seg_map_path=None),
        dict(img_path=None, img_id=None, seg_map_path=None),
    ]
