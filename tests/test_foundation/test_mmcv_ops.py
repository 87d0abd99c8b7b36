# Copyright (c) mmnanguard contributors. All rights reserved.
"""The compiled mmcv ops give hand-checked values on the CPU."""

import math

import pytest
import torch
from mmcv.ops import box_iou_rotated, nms_rotated

# (cx, cy, w, h, angle in radians)
CASES = [
    # identical boxes
    ((0.0, 0.0, 2.0, 2.0, 0.0), (0.0, 0.0, 2.0, 2.0, 0.0), 1.0),
    # shifted by half a width: overlap 1x2=2, union 6
    ((0.0, 0.0, 2.0, 2.0, 0.0), (1.0, 0.0, 2.0, 2.0, 0.0), 2.0 / 6.0),
    # a square rotated by 90 degrees is the same square
    ((0.0, 0.0, 2.0, 2.0, 0.0), (0.0, 0.0, 2.0, 2.0, math.pi / 2), 1.0),
    # a 2x2 square and itself turned 45 degrees: the overlap is a regular
    # octagon of area 8(sqrt(2)-1), the union 8 minus that
    (
        (0.0, 0.0, 2.0, 2.0, 0.0),
        (0.0, 0.0, 2.0, 2.0, math.pi / 4),
        8 * (math.sqrt(2) - 1) / (8 - 8 * (math.sqrt(2) - 1)),
    ),
    # disjoint
    ((0.0, 0.0, 2.0, 2.0, 0.0), (10.0, 10.0, 2.0, 2.0, 0.3), 0.0),
    # a 4x1 bar and the same bar turned 90 degrees: a 1x1 cross, union 7
    ((0.0, 0.0, 4.0, 1.0, 0.0), (0.0, 0.0, 4.0, 1.0, math.pi / 2), 1.0 / 7.0),
]


@pytest.mark.parametrize('box1, box2, expected', CASES)
def test_box_iou_rotated_hand_checked(box1, box2, expected):
    iou = box_iou_rotated(
        torch.tensor([box1]), torch.tensor([box2]), aligned=True
    )
    assert iou.item() == pytest.approx(expected, abs=1e-5)


def test_box_iou_rotated_matrix_shape_and_symmetry():
    boxes = torch.tensor([c[0] for c in CASES] + [c[1] for c in CASES])
    ious = box_iou_rotated(boxes, boxes)
    assert ious.shape == (len(boxes), len(boxes))
    torch.testing.assert_close(ious, ious.T, atol=1e-5, rtol=0)
    torch.testing.assert_close(
        ious.diagonal(), torch.ones(len(boxes)), atol=1e-5, rtol=0
    )


def test_nms_rotated_hand_checked():
    boxes = torch.tensor(
        [
            [0.0, 0.0, 2.0, 2.0, 0.0],  # score .9, kept
            [0.1, 0.0, 2.0, 2.0, 0.0],  # IoU ~0.9 with the first: suppressed
            [
                1.0,
                0.0,
                2.0,
                2.0,
                0.0,
            ],  # IoU 1/3 with the first: kept at thr .5
            [10.0, 10.0, 3.0, 1.0, 0.7],  # disjoint: kept
        ]
    )
    scores = torch.tensor([0.9, 0.8, 0.7, 0.6])
    dets, keep = nms_rotated(boxes, scores, iou_threshold=0.5)
    assert keep.tolist() == [0, 2, 3]
    torch.testing.assert_close(dets[:, -1], scores[[0, 2, 3]])
    # a stricter threshold also removes the box at IoU 1/3
    _, keep = nms_rotated(boxes, scores, iou_threshold=0.3)
    assert keep.tolist() == [0, 3]
