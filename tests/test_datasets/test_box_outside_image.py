# Copyright (c) mmnanguard contributors. All rights reserved.
"""A VOC box annotated outside its image (x 100..130 in a 96-px-wide
image): mmdet's ``Resize`` clips it to zero width. The incident's data
check calls it a box outside the image, clipped at the right border, with
the coordinates as annotated in the xml; the loading-stage check that
``tools/check_dataset.py`` runs flags it before any pipeline."""

import numpy as np
import pytest
from mmengine.dataset import pseudo_collate
from mmengine.registry import init_default_scope
from test_voc_xywh_box import _voc_root

from mmnanguard.datasets import checks
from mmnanguard.datasets.transforms.validate_annotations import check_results
from mmnanguard.engine.diagnosis.batch_checks import (
    check_batch,
    clipped_side,
)
from mmnanguard.engine.diagnosis.finding_words import describe_finding
from mmnanguard.engine.diagnosis.remedy import _data_remedy

PIPELINE = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='Resize', scale=(96, 80), keep_ratio=True),
    dict(type='RandomFlip', prob=0.0),
    dict(type='PackDetInputs'),
]


def _dataset(tmp_path, boxes, pipeline):
    from mmdet.registry import DATASETS

    init_default_scope('mmdet')
    return DATASETS.build(
        dict(
            type='VOCDataset',
            data_root=_voc_root(tmp_path, boxes),
            ann_file='VOC2007/ImageSets/Main/trainval.txt',
            data_prefix=dict(sub_data_root='VOC2007/'),
            filter_cfg=dict(filter_empty_gt=True, min_size=0),
            pipeline=pipeline,
        )
    )


def test_the_clipped_box_is_named_outside_with_its_xml_coordinates(tmp_path):
    dataset = _dataset(
        tmp_path, [(10, 10, 60, 50), (100, 10, 130, 50)], PIPELINE
    )
    findings = check_batch(pseudo_collate([dataset[0], dataset[1]]), None)
    (found,) = findings
    assert (found['sample'], found['check'], found['index']) == (
        1,
        'hbox_size',
        0,
    )
    # as mmdet loads the xml (1-based: 1 subtracted), x clipped to the width
    assert found['values'] == [96.0, 9.0, 96.0, 49.0]
    assert found['clipped_at'] == 'right' and found['img_shape'] == [80, 96]
    assert found['raw'] == [100.0, 10.0, 130.0, 50.0]  # as in the xml
    line = describe_finding(found)
    assert line.startswith('Annotations/000001.xml object 1')
    assert 'box outside the image, clipped to zero size at its right' in line
    assert '(100, 10, 130, 50 as annotated)' in line
    assert 'in the 96x80 image after the pipeline' in line
    (remedy, *_) = _data_remedy(found)
    assert 'lies outside its image' in remedy
    assert '(100.0, 10.0, 130.0, 50.0)' in remedy


def test_the_loading_stage_flags_it_before_the_pipeline(tmp_path):
    dataset = _dataset(
        tmp_path,
        [(10, 10, 60, 50), (100, 10, 130, 50)],
        PIPELINE[:2],
    )
    loaded = dataset.pipeline.transforms[1](
        dataset.pipeline.transforms[0](dataset.get_data_info(1))
    )
    found = check_results(
        loaded, num_classes=20, min_size=1.0, negative_coords=True
    )
    assert [v.check for v in found] == ['outside_image']
    assert 'right of the 96x80 image (x >= 99)' in found[0].detail
    assert (
        check_results(loaded, num_classes=20, min_size=1.0) == []
    )  # not after the pipeline


@pytest.mark.parametrize(
    'box, side',
    [
        ((100, 10, 130, 50), 'right of'),
        ((-40, 10, 0, 50), 'left of'),
        ((10, 80, 30, 95), 'below'),
        ((10, -20, 30, -1), 'above'),
        ((90, 10, 130, 50), None),  # crosses the border: clipped, not lost
        ((np.nan, 10, 130, 50), None),  # told by hbox_finite
    ],
)
def test_outside_image_sides(box, side):
    found = checks.check_outside_image(np.array([box], float), (80, 96))
    if side is None:
        assert found == []
        return
    (v,) = found
    assert v.check == 'outside_image' and v.index == 0
    assert f'lies {side} the 96x80 image' in v.detail


@pytest.mark.parametrize(
    'box, side',
    [
        ((96, 9, 96, 50), 'right'),
        ((0, 9, 0, 50), 'left'),
        ((3, 80, 30, 80), 'bottom'),
        ((3, 0, 30, 0), 'top'),
        ((40, 9, 40, 50), None),  # zero width inside: annotated so
        ((10, 9, 60, 50), None),
    ],
)
def test_clipped_side(box, side):
    assert clipped_side(box, (80, 96)) == side
    assert clipped_side(box, None) is None
