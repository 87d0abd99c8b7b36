# Copyright (c) mmnanguard contributors. All rights reserved.
"""A VOC box written as x, y, w, h (xmax < xmin) is told as such, and
found in its Annotations/*.xml file."""

from mmnanguard.datasets.checks import Violation, check_hboxes
from mmnanguard.datasets.scan import _locate


def test_an_inverted_box_is_told_as_written_as_xywh():
    # xmin=50, ymin=60 then w=30, h=20 where xmax, ymax belong
    (found,) = check_hboxes([[50.0, 60.0, 30.0, 20.0]], min_size=1)
    assert found.check == 'hbox_size'
    assert 'inverted box' in found.detail
    assert 'xmax < xmin (w=-20)' in found.detail
    assert 'ymax < ymin (h=-40)' in found.detail
    assert 'x, y, w, h' in found.detail


def test_a_thin_box_is_still_a_size_problem():
    (found,) = check_hboxes([[50.0, 60.0, 50.5, 80.0]], min_size=1)
    assert 'inverted' not in found.detail
    assert 'w=0.5' in found.detail


def test_a_voc_box_is_located_in_its_xml():
    v = Violation('hbox_size', 0, (50.0, 60.0, 30.0, 20.0), 'inverted box')
    results = dict(
        img_path='VOC2007/JPEGImages/000001.jpg',
        xml_path='VOC2007/Annotations/000001.xml',
    )
    # the xml itself is not on disk: its object cannot be told
    assert _locate(results, v, True) == (
        'VOC2007/Annotations/000001.xml',
        None,
        None,
    )
    assert _locate(dict(img_path='a.jpg'), v, True) == ('a.jpg', None, None)


def test_training_time_validation_names_the_voc_xml():
    from mmnanguard.datasets.transforms.validate_annotations import (
        sample_source,
    )

    results = dict(
        img_path='VOC2007/JPEGImages/000001.jpg',
        xml_path='VOC2007/Annotations/000001.xml',
    )
    assert sample_source(results) == (
        'VOC2007/JPEGImages/000001.jpg / VOC2007/Annotations/000001.xml'
    )
