# Copyright (c) mmnanguard contributors. All rights reserved.
"""Generate a tiny COCO-format detection dataset with real objects, each
with its box and its polygon (instance masks for Mask R-CNN and the like).

Layout, as mmdet's ``CocoDataset`` reads it::

    ROOT/images/000000.png
    ROOT/annotations/instances.json
"""

import json
import os
import os.path as osp
from typing import Dict, List

import cv2
import numpy as np

#: Class names of the generated set (pass as ``metainfo=dict(classes=...)``).
COCO_TINY_CLASSES = ('square', 'bar', 'block')


def make_coco_folders(root: str) -> str:
    """Create ``ROOT/images`` and ``ROOT/annotations``.

    Args:
        root (str): Dataset root.

    Returns:
        str: The image folder.
    """
    img_dir = osp.join(root, 'images')
    os.makedirs(img_dir, exist_ok=True)
    os.makedirs(osp.join(root, 'annotations'), exist_ok=True)
    return img_dir


def write_coco_annotations(
    root: str,
    name: str,
    images: List[dict],
    annotations: List[dict],
    categories: List[dict],
) -> str:
    """Write ``ROOT/annotations/NAME`` in the COCO format.

    Args:
        root (str): Dataset root.
        name (str): The json file's name.
        images (list[dict]): The ``images`` records.
        annotations (list[dict]): The ``annotations`` records.
        categories (list[dict]): The ``categories`` records.

    Returns:
        str: The written file.
    """
    ann_file = osp.join(root, 'annotations', name)
    with open(ann_file, 'w') as f:
        json.dump(
            dict(
                images=images, annotations=annotations, categories=categories
            ),
            f,
        )
    return ann_file


def generate_coco(
    root: str,
    num_images: int = 8,
    img_size: int = 256,
    objects_per_image: tuple = (2, 5),
    seed: int = 0,
) -> Dict[str, str]:
    """Write a tiny COCO-format set; deterministic given ``seed``.

    Args:
        root (str): Dataset root.
        num_images (int): Number of images. Defaults to 8.
        img_size (int): Image side in pixels. Defaults to 256.
        objects_per_image (tuple): Inclusive range of objects per image.
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
        for _ in range(
            rng.integers(objects_per_image[0], objects_per_image[1] + 1)
        ):
            w, h = rng.uniform(12, 80, size=2)
            x, y = rng.uniform(0, img_size - w), rng.uniform(0, img_size - h)
            label = int(rng.integers(len(COCO_TINY_CLASSES)))
            color = [
                int(c) for c in 80 + (np.arange(3) * 41 + label * 67) % 170
            ]
            cv2.rectangle(
                img,
                (int(x), int(y)),
                (int(x + w), int(y + h)),
                color,
                thickness=-1,
            )
            annotations.append(
                dict(
                    id=len(annotations) + 1,
                    image_id=i + 1,
                    category_id=label + 1,
                    bbox=[x, y, w, h],
                    # the filled rectangle as a polygon: instance masks
                    segmentation=[[x, y, x + w, y, x + w, y + h, x, y + h]],
                    area=w * h,
                    iscrowd=0,
                )
            )
        cv2.imwrite(osp.join(img_dir, file_name), img)
        images.append(
            dict(
                id=i + 1, file_name=file_name, width=img_size, height=img_size
            )
        )
    categories = [
        dict(id=k + 1, name=n) for k, n in enumerate(COCO_TINY_CLASSES)
    ]
    ann_file = write_coco_annotations(
        root, 'instances.json', images, annotations, categories
    )
    return dict(ann_file=ann_file, img_dir=img_dir)
