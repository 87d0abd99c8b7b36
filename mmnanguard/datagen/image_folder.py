# Copyright (c) mmnanguard contributors. All rights reserved.
"""Generate a tiny image-classification set in the ImageFolder layout
(one sub-folder per class), as mmpretrain's ``CustomDataset`` reads it::

    ROOT/train/circle/000000.png
    ROOT/train/cross/000001.png
    ...
"""

import os
import os.path as osp
from typing import Dict, List

import cv2
import numpy as np

#: Class names of the generated set, in the order ``CustomDataset`` gives
#: them (sorted folder names).
IMAGE_FOLDER_CLASSES = ('circle', 'cross', 'square')


def _draw(img: np.ndarray, label: int, rng: np.random.Generator) -> None:
    size = img.shape[0]
    c = rng.uniform(0.35, 0.65, size=2) * size
    r = rng.uniform(0.15, 0.3) * size
    color = (220, 200, 120)
    x, y, r = int(c[0]), int(c[1]), int(r)
    if label == 0:
        cv2.circle(img, (x, y), r, color, thickness=-1)
    elif label == 1:
        cv2.line(img, (x - r, y - r), (x + r, y + r), color, thickness=3)
        cv2.line(img, (x - r, y + r), (x + r, y - r), color, thickness=3)
    else:
        cv2.rectangle(img, (x - r, y - r), (x + r, y + r), color, -1)


def generate_image_folder(
    root: str,
    split: str = 'train',
    images_per_class: int = 4,
    img_size: int = 48,
    seed: int = 0,
) -> Dict[str, List[str]]:
    """Write a tiny ImageFolder set; deterministic given ``seed``.

    Args:
        root (str): Dataset root.
        split (str): Sub-folder holding the class folders. Defaults to
            ``'train'``.
        images_per_class (int): Images per class. Defaults to 4.
        img_size (int): Image side in pixels. Defaults to 48.
        seed (int): Random seed. Defaults to 0.

    Returns:
        dict: ``data_prefix`` (the split folder) and ``files``, the written
        image paths by class name.
    """
    rng = np.random.default_rng(seed)
    prefix = osp.join(root, split)
    files: Dict[str, List[str]] = {}
    index = 0
    for label, name in enumerate(IMAGE_FOLDER_CLASSES):
        folder = osp.join(prefix, name)
        os.makedirs(folder, exist_ok=True)
        files[name] = []
        for _ in range(images_per_class):
            img = rng.integers(
                0, 60, size=(img_size, img_size, 3), dtype=np.uint8
            )
            _draw(img, label, rng)
            path = osp.join(folder, f'{index:06d}.png')
            cv2.imwrite(path, img)
            files[name].append(path)
            index += 1
    return dict(data_prefix=prefix, files=files)
