# Copyright (c) mmnanguard contributors. All rights reserved.
"""The record behind an instance, against mmdet's own parsers: every
``gt_instances`` box of the real ``CocoDataset`` (and ``VOCDataset``) is
found again in the json (xml) record that ``coco_annotation_id``
(``voc_object_index``) names, with records that mmdet drops or ignores
placed among the rest; and a bad box in a batch is reported by its json
and annotation id, not by its image."""

import json
import os
import os.path as osp

import numpy as np
import pytest
from mmcv import imwrite
from mmengine.dataset import pseudo_collate
from mmengine.registry import init_default_scope

from mmnanguard.datagen import generate_coco
from mmnanguard.datagen.coco import COCO_TINY_CLASSES
from mmnanguard.datasets.annotation_records import (
    annotation_file_of,
    coco_annotation_id,
    voc_object_index,
)
from mmnanguard.datasets.checks import Violation
from mmnanguard.datasets.scan import _locate
from mmnanguard.engine.diagnosis.batch_checks import (
    check_batch,
)
from mmnanguard.engine.diagnosis.finding_words import describe_finding
from mmnanguard.engine.diagnosis.remedy import _data_remedy


def pipeline(width, height):
    """Load, a resize to the image's own size, pack."""
    return [
        dict(type='LoadImageFromFile'),
        dict(type='LoadAnnotations', with_bbox=True),
        dict(type='Resize', scale=(width, height), keep_ratio=True),
        dict(type='RandomFlip', prob=0.0),
        dict(type='PackDetInputs'),
    ]


def _coco_with_extra_records(root):
    """generate_coco's set, with records mmdet drops (a side < 1, a box
    outside the image, ``ignore``) or ignores (``iscrowd``) put first in
    image 1's list, and one zero-height box kept by the size filter of
    mmdet (area > 0 declared, h = 1 then squashed) at its end."""
    written = generate_coco(root, num_images=3, seed=0)
    with open(written['ann_file']) as f:
        coco = json.load(f)
    next_id = max(a['id'] for a in coco['annotations']) + 1
    extra = [
        dict(bbox=[10, 10, 0.5, 20], area=10, iscrowd=0),  # too narrow
        dict(bbox=[300, 10, 20, 20], area=400, iscrowd=0),  # outside
        dict(bbox=[5, 5, 30, 30], area=900, iscrowd=1),  # crowd: ignored
        dict(bbox=[40, 40, 30, 30], area=900, iscrowd=0, ignore=True),
    ]
    for k, ann in enumerate(extra):
        ann.update(id=next_id + k, image_id=1, category_id=1)
    coco['annotations'] = extra + coco['annotations']
    with open(written['ann_file'], 'w') as f:
        json.dump(coco, f)
    return written['ann_file'], coco


def _coco_dataset(root, ann_file):
    from mmdet.registry import DATASETS

    init_default_scope('mmdet')
    return DATASETS.build(
        dict(
            type='CocoDataset',
            data_root=str(root),
            ann_file=ann_file,
            data_prefix=dict(img='images/'),
            metainfo=dict(classes=COCO_TINY_CLASSES),
            filter_cfg=dict(filter_empty_gt=False),
            pipeline=pipeline(256, 256),
        )
    )


def test_every_coco_instance_is_found_in_its_record(tmp_path):
    ann_file, coco = _coco_with_extra_records(str(tmp_path))
    categories = [c['name'] for c in coco['categories']]
    dataset = _coco_dataset(tmp_path, ann_file)
    assert len(categories) == 3  # the dataset's classes: every category
    by_id = {a['id']: a for a in coco['annotations']}
    checked = 0
    for k in range(len(dataset)):
        sample = dataset[k]['data_samples']
        img_id = sample.img_id
        boxes = sample.gt_instances.bboxes.numpy()
        for index, box in enumerate(boxes):
            ann_id = coco_annotation_id(ann_file, img_id, index, len(boxes))
            x, y, w, h = by_id[ann_id]['bbox']
            assert by_id[ann_id]['image_id'] == img_id
            np.testing.assert_allclose(box, [x, y, x + w, y + h], rtol=1e-6)
            checked += 1
        # another count (a transform dropped one): no answer, not a guess
        assert coco_annotation_id(ann_file, img_id, 0, len(boxes) + 1) is None
        assert (
            coco_annotation_id(ann_file, img_id, len(boxes), len(boxes))
            is None
        )
    assert checked == sum(
        len(dataset[k]['data_samples'].gt_instances) for k in range(3)
    )
    assert annotation_file_of(dataset) == ann_file


@pytest.mark.parametrize(
    'content',
    [
        '{"images": [{"id": 1}], "annotations": [{"image_id": 1',  # cut
        '[1, 2, 3]',
        '{"images": "x", "annotations": 7}',
        '{"images": [{"id": 1, "width": 9, "height": 9}], "annotations":'
        ' [{"image_id": 1, "bbox": ["a", 1, 2, 3], "area": 4}]}',
        '{"images": [{"id": 1, "width": 9, "height": 9}], "annotations":'
        ' [{"image_id": 1, "bbox": [NaN, 1, 2, 3], "area": 4}]}',
        '{"images": [{"id": [1], "width": 9}], "annotations":'
        ' [{"image_id": [1], "bbox": [1, 1, 2, 3], "area": 4}]}',
        '{"images": [7, null], "annotations": [null, {"image_id": {}}]}',
    ],
)
def test_a_broken_json_names_no_record(tmp_path, content):
    path = tmp_path / 'ann.json'
    path.write_text(content)
    assert coco_annotation_id(str(path), 1, 0, 1) is None


def test_only_a_plain_json_file_is_read(tmp_path):
    ann_file, _ = _coco_with_extra_records(str(tmp_path))
    link = tmp_path / 'link.json'
    os.symlink(ann_file, link)
    assert coco_annotation_id(str(link), 0, 0, 1) is None
    assert coco_annotation_id(ann_file[:-5] + '.txt', 0, 0, 1) is None
    assert coco_annotation_id(12, 0, 0, 1) is None
    assert coco_annotation_id(str(tmp_path / 'missing.json'), 0, 0, 1) is None


def test_a_bad_coco_box_is_named_by_its_json_and_annotation_id(tmp_path):
    ann_file, coco = _coco_with_extra_records(str(tmp_path))
    # image 2's second kept record squashed to zero height after loading
    # (as a clipping transform or a collinear polygon would)
    target = [a for a in coco['annotations'] if a['image_id'] == 2][1]
    dataset = _coco_dataset(tmp_path, ann_file)
    k = [dataset[j]['data_samples'].img_id for j in range(3)].index(2)
    item = dataset[k]
    item['data_samples'].gt_instances.bboxes.tensor[1, 3] = item[
        'data_samples'
    ].gt_instances.bboxes.tensor[1, 1]
    findings = check_batch(pseudo_collate([item]), ann_file=ann_file)
    assert [(f['check'], f['index']) for f in findings] == [('hbox_size', 1)]
    found = findings[0]
    assert found['annfile'] == ann_file and found['ann_id'] == target['id']
    (image,) = [i['file_name'] for i in coco['images'] if i['id'] == 2]
    line = describe_finding(found)
    assert line.startswith(
        f"annotations/{osp.basename(ann_file)} annotation id {target['id']}"
        f' (image {image}) (batch sample 0, instance 1)'
    )
    remedy = _data_remedy(found)[0]
    assert f"{ann_file} annotation id {target['id']}" in remedy
    # without the json (an old report), the image is named as before
    (plain,) = check_batch(pseudo_collate([item]))
    assert 'ann_id' not in plain
    assert describe_finding(plain).startswith(f'{image} (batch sample 0')


XML = """<annotation><size><width>96</width><height>80</height></size>
{objects}</annotation>"""
OBJECT = """<object><name>dog</name><difficult>{d}</difficult><bndbox>
<xmin>{b[0]}</xmin><ymin>{b[1]}</ymin><xmax>{b[2]}</xmax><ymax>{b[3]}</ymax>
</bndbox></object>"""


def test_every_voc_instance_is_found_in_its_object(tmp_path):
    from mmdet.registry import DATASETS

    init_default_scope('mmdet')
    voc = tmp_path / 'VOC2007'
    for sub in ('JPEGImages', 'Annotations', 'ImageSets/Main'):
        (voc / sub).mkdir(parents=True)
    objects = [
        ((10, 10, 40, 30), 1),
        ((20, 15, 60, 50), 0),
        ((5, 5, 30, 70), 1),
        ((50, 30, 90, 75), 0),
        ((1, 2, 20, 22), 0),
    ]
    imwrite(np.zeros((80, 96, 3), np.uint8), str(voc / 'JPEGImages/0.jpg'))
    xml = voc / 'Annotations/0.xml'
    xml.write_text(
        XML.format(
            objects=''.join(OBJECT.format(b=b, d=d) for b, d in objects)
        )
    )
    (voc / 'ImageSets/Main/trainval.txt').write_text('0\n')
    dataset = DATASETS.build(
        dict(
            type='VOCDataset',
            data_root=str(tmp_path) + '/',
            ann_file='VOC2007/ImageSets/Main/trainval.txt',
            data_prefix=dict(sub_data_root='VOC2007/'),
            filter_cfg=dict(filter_empty_gt=False),
            pipeline=pipeline(96, 80),
        )
    )
    boxes = dataset[0]['data_samples'].gt_instances.bboxes.numpy()
    assert len(boxes) == 3
    for index, box in enumerate(boxes):
        position = voc_object_index(str(xml), index, len(boxes))
        xmin, ymin, xmax, ymax = objects[position - 1][0]
        assert objects[position - 1][1] == 0  # not difficult
        # mmdet makes VOC's 1-based pixel coordinates 0-based
        np.testing.assert_allclose(
            box, np.subtract([xmin, ymin, xmax, ymax], 1)
        )
    assert voc_object_index(str(xml), 0, 4) is None
    # check_dataset, at the loading stage: the difficult objects are
    # instances too (PackDetInputs has not moved them yet)
    loaded = dict(xml_path=str(xml), gt_bboxes=np.zeros((5, 4)))
    v = Violation('hbox_size', 2, (4.0, 4.0, 29.0, 4.0), 'zero height')
    assert _locate(loaded, v, True) == (str(xml), None, 'object 3')
    assert _locate(loaded, v, False) == (str(xml), None, None)
    broken = tmp_path / 'broken.xml'
    broken.write_text('<annotation><object>')
    assert voc_object_index(str(broken), 0, 1) is None


def test_a_coco_box_kept_by_a_wrong_declared_size_is_named_clipped(tmp_path):
    """The json declares image 1 as 512x512; its file is 256x256. mmdet
    keeps a box at x 300..340 (inside the declared image) and ``Resize``
    clips it to zero width at the right border: the report gives the box
    as the json writes it and both sizes."""
    written = generate_coco(str(tmp_path), num_images=2, seed=0)
    ann_file = written['ann_file']
    with open(ann_file) as f:
        coco = json.load(f)
    (image,) = [i for i in coco['images'] if i['id'] == 1]
    real = (image['height'], image['width'])
    assert real == (256, 256)
    image.update(width=512, height=512)
    ann_id = max(a['id'] for a in coco['annotations']) + 1
    coco['annotations'].append(
        dict(
            id=ann_id,
            image_id=1,
            category_id=1,
            bbox=[300, 10, 40, 40],
            area=1600,
            iscrowd=0,
        )
    )
    with open(ann_file, 'w') as f:
        json.dump(coco, f)
    dataset = _coco_dataset(tmp_path, ann_file)
    k = [dataset[j]['data_samples'].img_id for j in range(2)].index(1)
    findings = check_batch(pseudo_collate([dataset[k]]), ann_file=ann_file)
    (found,) = findings
    assert found['check'] == 'hbox_size' and found['ann_id'] == ann_id
    assert found['values'] == [256.0, 10.0, 256.0, 50.0]
    assert found['clipped_at'] == 'right'
    assert found['raw'] == [300.0, 10.0, 40.0, 40.0]
    assert found['declared_shape'] == [512, 512]
    assert found['ori_shape'] == [256, 256]
    line = describe_finding(found)
    assert f'annotation id {ann_id}' in line
    assert 'box outside the image, clipped to zero size at its right' in line
    assert (
        'the box (annotated as x, y, w, h = 300, 10, 40, 40) lies outside'
        in line
    )
    assert 'declares the image 512x512, the file is 256x256' in line
    remedy = _data_remedy(found)
    assert '(300.0, 10.0, 40.0, 40.0), x, y, w, h)' in remedy[0]
    assert 'declares this image as 512x512' in remedy[1]
    assert '`width` and `height` of its `images` entry' in remedy[1]
