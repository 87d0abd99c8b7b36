# Copyright (c) mmnanguard contributors. All rights reserved.
"""Generate a tiny COCO-format person keypoint dataset: stick figures
whose 17 joints (the COCO order) are annotated, as mmpose's
``CocoDataset`` reads it::

    ROOT/images/000000.png
    ROOT/annotations/person_keypoints.json
"""

import os.path as osp
from typing import Dict

import cv2
import numpy as np

from .coco import make_coco_folders, write_coco_annotations

#: The 17 COCO keypoints, in their order.
COCO_KEYPOINT_NAMES = (
    'nose',
    'left_eye',
    'right_eye',
    'left_ear',
    'right_ear',
    'left_shoulder',
    'right_shoulder',
    'left_elbow',
    'right_elbow',
    'left_wrist',
    'right_wrist',
    'left_hip',
    'right_hip',
    'left_knee',
    'right_knee',
    'left_ankle',
    'right_ankle',
)

#: The joints of a standing figure in a unit box (x right, y down).
_POSE = np.array(
    [
        (0.50, 0.08),
        (0.46, 0.06),
        (0.54, 0.06),
        (0.42, 0.08),
        (0.58, 0.08),
        (0.35, 0.25),
        (0.65, 0.25),
        (0.25, 0.42),
        (0.75, 0.42),
        (0.20, 0.58),
        (0.80, 0.58),
        (0.40, 0.55),
        (0.60, 0.55),
        (0.38, 0.75),
        (0.62, 0.75),
        (0.36, 0.95),
        (0.64, 0.95),
    ]
)

#: Limbs drawn between joints (0-based indices).
_LIMBS = (
    (5, 7), (7, 9), (6, 8), (8, 10), (5, 6), (5, 11), (6, 12), (11, 12),
    (11, 13), (13, 15), (12, 14), (14, 16), (0, 5), (0, 6),
)  # fmt: skip


def generate_coco_keypoints(
    root: str,
    num_images: int = 4,
    img_size: int = 96,
    people_per_image: tuple = (1, 2),
    seed: int = 0,
) -> Dict[str, str]:
    """Write a tiny COCO person-keypoint set; deterministic given ``seed``.

    Every person is a stick figure with all 17 joints visible (``v=2``),
    its box the joints' extent plus a margin.

    Args:
        root (str): Dataset root.
        num_images (int): Number of images. Defaults to 4.
        img_size (int): Image side in pixels. Defaults to 96.
        people_per_image (tuple): Inclusive range of people per image.
        seed (int): Random seed. Defaults to 0.

    Returns:
        dict: ``ann_file`` and ``img_dir``, the written paths.
    """
    rng = np.random.default_rng(seed)
    img_dir = make_coco_folders(root)
    images, annotations = [], []
    for i in range(num_images):
        file_name = f'{i:06d}.png'
        img = rng.integers(0, 60, size=(img_size, img_size, 3), dtype=np.uint8)
        count = rng.integers(people_per_image[0], people_per_image[1] + 1)
        for _ in range(count):
            h = rng.uniform(0.45, 0.9) * img_size
            w = h * rng.uniform(0.45, 0.7)
            x = rng.uniform(0, img_size - w)
            y = rng.uniform(0, img_size - h)
            joints = _POSE * (w, h) + (x, y)
            joints += rng.normal(0, 0.01 * h, size=joints.shape)
            joints = np.clip(joints, 0, img_size - 1)
            for a, b in _LIMBS:
                cv2.line(
                    img,
                    tuple(int(v) for v in joints[a]),
                    tuple(int(v) for v in joints[b]),
                    (200, 180, 160),
                    thickness=2,
                )
            x1, y1 = joints.min(axis=0) - 2
            x2, y2 = joints.max(axis=0) + 2
            x1, y1 = max(x1, 0.0), max(y1, 0.0)
            bw = min(x2, img_size - 1) - x1
            bh = min(y2, img_size - 1) - y1
            keypoints = []
            for jx, jy in joints:
                keypoints += [float(jx), float(jy), 2]
            annotations.append(
                dict(
                    id=len(annotations) + 1,
                    image_id=i + 1,
                    category_id=1,
                    bbox=[float(x1), float(y1), float(bw), float(bh)],
                    area=float(bw * bh),
                    iscrowd=0,
                    num_keypoints=len(COCO_KEYPOINT_NAMES),
                    keypoints=keypoints,
                    segmentation=[],
                )
            )
        cv2.imwrite(osp.join(img_dir, file_name), img)
        images.append(
            dict(
                id=i + 1, file_name=file_name, width=img_size, height=img_size
            )
        )
    categories = [
        dict(
            id=1,
            name='person',
            supercategory='person',
            keypoints=list(COCO_KEYPOINT_NAMES),
            skeleton=[[a + 1, b + 1] for a, b in _LIMBS],
        )
    ]
    ann_file = write_coco_annotations(
        root, 'person_keypoints.json', images, annotations, categories
    )
    return dict(ann_file=ann_file, img_dir=img_dir)
