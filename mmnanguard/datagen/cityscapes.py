# Copyright (c) mmnanguard contributors. All rights reserved.
"""Generate a tiny Cityscapes-format segmentation dataset.

The layout is the one mmseg's ``CityscapesDataset`` reads::

    ROOT/leftImg8bit/SPLIT/CITY/CITY_000000_000000_leftImg8bit.png
    ROOT/gtFine/SPLIT/CITY/CITY_000000_000000_gtFine_labelTrainIds.png

Label maps hold train ids ``0..18`` and ``255`` (ignore) regions; on request
a rectangle of a stray value (e.g. 19, or the raw label id 34) is planted.
"""

import os
import os.path as osp
from typing import Any, Dict, List, Sequence, Tuple

import cv2
import numpy as np

#: Number of Cityscapes train ids (``CityscapesDataset`` classes).
CITYSCAPES_NUM_CLASSES = 19


def generate_cityscapes(
    root: str,
    num_images: int = 4,
    img_size: Tuple[int, int] = (256, 128),
    seed: int = 0,
    split: str = 'train',
    cities: Sequence[str] = ('aachen', 'bochum'),
    stray_values: Sequence[int] = (),
) -> Dict[str, List[Any]]:
    """Write a tiny Cityscapes split; deterministic given the arguments.

    Each image is a few horizontal bands of train ids (like road, building,
    sky) with random rectangles of other ids and one ``255`` region; the
    RGB image paints each id in its own colour plus noise.

    Args:
        root (str): Dataset root (``data_root`` in configs).
        num_images (int): Number of images, spread over ``cities``.
            Defaults to 4.
        img_size (tuple): ``(width, height)``. Defaults to ``(256, 128)``.
        seed (int): Random seed. Defaults to 0.
        split (str): Split folder. Defaults to ``'train'``.
        cities (Sequence[str]): City folder names.
        stray_values (Sequence[int]): The k-th value is planted as a
            16x12 rectangle into label map ``k % num_images``.

    Returns:
        dict: ``images`` and ``seg_maps`` (written paths in order) and
        ``stray``: one dict per planted value with ``value``, ``seg_map``,
        ``pixels`` (how many pixels hold it).

    Raises:
        ValueError: If a stray value does not fit in uint8 or is a valid
            train id.
    """
    for value in stray_values:
        if not 0 <= value <= 254 or value < CITYSCAPES_NUM_CLASSES:
            raise ValueError(
                f'stray value must lie in [19, 254], got ' f'{value!r}'
            )
    rng = np.random.default_rng(seed)
    width, height = img_size
    palette = rng.integers(0, 256, size=(256, 3))
    written: Dict[str, List[Any]] = dict(images=[], seg_maps=[], stray=[])
    for i in range(num_images):
        city = cities[i % len(cities)]
        img_dir = osp.join(root, 'leftImg8bit', split, city)
        seg_dir = osp.join(root, 'gtFine', split, city)
        os.makedirs(img_dir, exist_ok=True)
        os.makedirs(seg_dir, exist_ok=True)
        label = np.empty((height, width), dtype=np.uint8)
        bands = rng.choice(CITYSCAPES_NUM_CLASSES, size=3, replace=False)
        edges = np.linspace(0, height, 4).astype(int)
        for band, lo, hi in zip(bands, edges[:-1], edges[1:]):
            label[lo:hi] = band
        for _ in range(4):
            x, y = rng.integers(0, width - 24), rng.integers(0, height - 24)
            w, h = rng.integers(8, 24, size=2)
            label[y : y + h, x : x + w] = rng.integers(CITYSCAPES_NUM_CLASSES)
        x, y = rng.integers(0, width - 32), rng.integers(0, height - 20)
        label[y : y + 20, x : x + 32] = 255
        name = f'{city}_{i:06d}_000019'
        seg_path = osp.join(seg_dir, f'{name}_gtFine_labelTrainIds.png')
        for k, value in enumerate(stray_values):
            if k % num_images == i:
                x0, y0 = 8 + 20 * (k // num_images), 8
                label[y0 : y0 + 12, x0 : x0 + 16] = value
        for k, value in enumerate(stray_values):
            if k % num_images == i:
                written['stray'].append(
                    dict(
                        value=int(value),
                        seg_map=seg_path,
                        pixels=int((label == value).sum()),
                    )
                )
        img = palette[label].astype(np.int64)
        img += rng.integers(-20, 21, size=img.shape)
        img_path = osp.join(img_dir, f'{name}_leftImg8bit.png')
        cv2.imwrite(img_path, np.clip(img, 0, 255).astype(np.uint8))
        cv2.imwrite(seg_path, label)
        written['images'].append(img_path)
        written['seg_maps'].append(seg_path)
    return written
