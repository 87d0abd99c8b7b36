# Copyright (c) mmnanguard contributors. All rights reserved.
"""The batch layouts of the toolboxes, made by their own datasets,
pipelines and collate functions on generated data, read by
:mod:`mmnanguard.engine.incident.batch_layout` and checked by the replay's
data checks and the per-iteration input check:

* mmyolo's ``yolov5_collate``: ``data_samples`` is a dict, the boxes of the
  whole batch one ``bboxes_labels`` tensor with the image index in column
  0, the file names dropped (kept by ``KeepSampleNames``);
* mmpretrain's ``DataSample.gt_label`` (class indices) and mmpose's
  ``PoseDataSample`` from mmengine's ``pseudo_collate``.
"""

import numpy as np
import pytest
import torch
from mmengine.dataset import pseudo_collate
from mmengine.registry import DefaultScope
from stack_marks import needs_mmpretrain, needs_mmyolo

from mmnanguard.datagen import COCO_TINY_CLASSES, IMAGE_FOLDER_CLASSES
from mmnanguard.engine.diagnosis.batch_checks import check_batch
from mmnanguard.engine.guard.input_check import batch_tensors, finite_flag
from mmnanguard.engine.incident.batch_layout import (
    KeepSampleNames,
    sample_records,
    sample_sources,
)

pytestmark = pytest.mark.stack_smoke


@pytest.fixture(scope='module')
def yolo_items(tiny_coco_root):
    from mmyolo.datasets import YOLOv5CocoDataset

    with DefaultScope.overwrite_default_scope('mmyolo'):
        dataset = YOLOv5CocoDataset(
            data_root=tiny_coco_root,
            ann_file='annotations/instances.json',
            data_prefix=dict(img='images/'),
            metainfo=dict(classes=COCO_TINY_CLASSES),
            pipeline=[
                dict(type='LoadImageFromFile'),
                dict(type='LoadAnnotations', with_bbox=True),
                dict(
                    type='mmdet.PackDetInputs',
                    meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape'),
                ),
            ],
        )
        items = [dataset[i] for i in range(3)]
    return dataset, items


def yolo_batch(items):
    from mmyolo.datasets.utils import yolov5_collate

    return KeepSampleNames(yolov5_collate)(items)


@needs_mmyolo
def test_yolov5_collate_records_per_image(yolo_items):
    dataset, items = yolo_items
    batch = yolo_batch(items)
    assert isinstance(batch['data_samples'], dict)
    records = sample_records(batch)
    assert len(records) == 3
    for i, record in enumerate(records):
        # independent: the same items through mmengine's pseudo_collate
        sample = pseudo_collate(items)['data_samples'][i]
        assert record['img_path'] == dataset.get_data_info(i)['img_path']
        assert record['img_id'] == dataset.get_data_info(i)['img_id']
        np.testing.assert_array_equal(
            record['boxes'].numpy(), sample.gt_instances.bboxes.tensor.numpy()
        )
        assert record['labels'].tolist() == sample.gt_instances.labels.tolist()
    assert [s['img_path'] for s in sample_sources(batch)] == [
        r['img_path'] for r in records
    ]


@needs_mmyolo
def test_yolov5_preprocessed_batch_keeps_the_raw_names(yolo_items):
    from mmyolo.models.data_preprocessors import YOLOv5DetDataPreprocessor

    _, items = yolo_items
    batch = yolo_batch(items)
    preprocessor = YOLOv5DetDataPreprocessor(
        mean=[0.0, 0.0, 0.0], std=[255.0, 255.0, 255.0], bgr_to_rgb=True
    )
    preprocessed = preprocessor(batch, True)
    # mmyolo rebuilds img_metas: only batch_input_shape is left there
    assert 'img_path' not in preprocessed['data_samples']['img_metas'][0]
    rows = preprocessed['data_samples']['bboxes_labels']
    image = 2
    box = int(torch.nonzero(rows[:, 0] == image)[0, 0])
    rows[box, 4] = rows[box, 2]  # x2 = x1: a zero-width box
    findings = check_batch(batch, preprocessed, len(COCO_TINY_CLASSES))
    assert [(f['sample'], f['index'], f['check']) for f in findings] == [
        (image, 0, 'hbox_size')
    ]
    assert findings[0]['img_path'] == items[image]['data_samples'].img_path


@needs_mmyolo
def test_yolov5_labels_and_input_flag(yolo_items):
    _, items = yolo_items
    batch = yolo_batch(items)
    rows = batch['data_samples']['bboxes_labels']
    assert bool(finite_flag(batch_tensors(batch)))
    rows[-1, 1] = len(COCO_TINY_CLASSES)  # a label out of range
    findings = check_batch(batch, None, len(COCO_TINY_CLASSES))
    assert [(f['sample'], f['check']) for f in findings] == [
        (int(rows[-1, 0]), 'label_range')
    ]
    rows[0, 3] = float('nan')  # a box the per-iteration check must see
    assert not bool(finite_flag(batch_tensors(batch)))


@needs_mmpretrain
def test_mmpretrain_gt_label_is_checked(tiny_image_folder):
    from mmpretrain.datasets import CustomDataset

    with DefaultScope.overwrite_default_scope('mmpretrain'):
        dataset = CustomDataset(
            data_prefix=tiny_image_folder['data_prefix'],
            with_label=True,
            pipeline=[dict(type='LoadImageFromFile'), dict(type='PackInputs')],
        )
        items = [dataset[0], dataset[5], dataset[10]]
    batch = pseudo_collate(items)
    records = sample_records(batch)
    # independent: the class folder each file lies in
    for record in records:
        folder = record['img_path'].split('/')[-2]
        assert record['class_labels'].tolist() == [
            IMAGE_FOLDER_CLASSES.index(folder)
        ]
    assert check_batch(batch, None, len(IMAGE_FOLDER_CLASSES)) == []
    batch['data_samples'][1].set_gt_label(len(IMAGE_FOLDER_CLASSES))
    findings = check_batch(batch, None, len(IMAGE_FOLDER_CLASSES))
    assert [(f['sample'], f['stage'], f['check']) for f in findings] == [
        (1, 'gt_label', 'label_range')
    ]
    assert findings[0]['img_path'] == items[1]['data_samples'].img_path
