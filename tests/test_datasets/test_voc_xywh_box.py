# Copyright (c) mmnanguard contributors. All rights reserved.
"""The user case of a VOC box written as x, y, w, h (xmax < xmin): mmdet's
real ``VOCDataset`` and training pipeline load it, and the incident's data
check names it as an inverted box in its ``Annotations/*.xml`` file."""

import os.path as osp

import numpy as np
from mmcv import imwrite
from mmengine.dataset import pseudo_collate
from mmengine.registry import init_default_scope

from mmnanguard.engine.diagnosis.batch_checks import (
    check_batch,
)
from mmnanguard.engine.diagnosis.finding_words import describe_finding

XML = """<annotation>
  <filename>{name}.jpg</filename>
  <size><width>96</width><height>80</height><depth>3</depth></size>
  <object><name>dog</name><difficult>0</difficult>
    <bndbox><xmin>{b[0]}</xmin><ymin>{b[1]}</ymin><xmax>{b[2]}</xmax><ymax>{b[3]}</ymax></bndbox>
  </object>
</annotation>
"""


def _voc_root(root, boxes):
    """A VOC2007 folder: one image per box, its xml, the trainval list."""
    voc = root / 'VOC2007'
    for sub in ('JPEGImages', 'Annotations', 'ImageSets/Main'):
        (voc / sub).mkdir(parents=True)
    names = []
    for k, box in enumerate(boxes):
        name = f'{k:06d}'
        imwrite(
            np.full((80, 96, 3), 127, np.uint8),
            str(voc / 'JPEGImages' / f'{name}.jpg'),
        )
        (voc / 'Annotations' / f'{name}.xml').write_text(
            XML.format(name=name, b=box)
        )
        names.append(name)
    (voc / 'ImageSets/Main/trainval.txt').write_text('\n'.join(names) + '\n')
    return str(root) + '/'


def test_voc_box_written_as_xywh_is_named_in_its_xml(tmp_path):
    from mmdet.registry import DATASETS

    init_default_scope('mmdet')
    # box 0 is right; box 1 is x=50, y=40, w=30, h=20 written where
    # xmax, ymax belong
    data_root = _voc_root(tmp_path, [(10, 10, 60, 50), (50, 40, 30, 20)])
    dataset = DATASETS.build(
        dict(
            type='VOCDataset',
            data_root=data_root,
            ann_file='VOC2007/ImageSets/Main/trainval.txt',
            data_prefix=dict(sub_data_root='VOC2007/'),
            filter_cfg=dict(filter_empty_gt=True, min_size=0),
            pipeline=[
                dict(type='LoadImageFromFile'),
                dict(type='LoadAnnotations', with_bbox=True),
                dict(type='Resize', scale=(96, 80), keep_ratio=True),
                dict(type='RandomFlip', prob=0.0),
                dict(type='PackDetInputs'),
            ],
        )
    )
    batch = pseudo_collate([dataset[0], dataset[1]])
    findings = check_batch(batch, num_classes=20)
    # only the second image's box is bad, and it is inverted on both sides
    assert [(f['sample'], f['check'], f['index']) for f in findings] == [
        (1, 'hbox_size', 0)
    ]
    line = describe_finding(findings[0])
    assert line.startswith(
        'Annotations/000001.xml object 1 (batch sample 1, instance 0)'
    )
    assert 'inverted box (x1, y1, x2, y2) = (' in line
    assert 'zero-size' not in line
    # xmax - xmin and ymax - ymin as mmdet loads them (it subtracts 1 from
    # VOC's 1-based xmin/ymin)
    x1, y1, x2, y2 = findings[0]['values']
    assert x2 - x1 < 0 and y2 - y1 < 0
    assert f'w={x2 - x1:.6g}' in line and f'h={y2 - y1:.6g}' in line
    assert osp.isfile(findings[0]['annfile'])
