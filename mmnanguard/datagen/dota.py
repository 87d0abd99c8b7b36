# Copyright (c) mmnanguard contributors. All rights reserved.
"""Generate a tiny DOTA-format dataset with real rotated objects.

The layout is the one mmrotate's ``DOTADataset`` reads::

    ROOT/SPLIT/images/P0000.png
    ROOT/SPLIT/annfiles/P0000.txt   # x1 y1 x2 y2 x3 y3 x4 y4 class difficulty

On request (``broken=``) it plants annotation errors and says where each is
(annfile and 1-based line), for the tests of ``ValidateAnnotations`` and
``tools/check_dataset.py``.
"""

import os
import os.path as osp
from typing import Any, Dict, List, Optional, Sequence

import cv2
import numpy as np

#: The 15 DOTA-v1.0 classes, in ``DOTADataset.METAINFO`` order.
DOTA_CLASSES = (
    'plane',
    'baseball-diamond',
    'bridge',
    'ground-track-field',
    'small-vehicle',
    'large-vehicle',
    'ship',
    'tennis-court',
    'basketball-court',
    'storage-tank',
    'soccer-ball-field',
    'roundabout',
    'harbor',
    'swimming-pool',
    'helicopter',
)


def random_rotated_object(
    rng: np.random.Generator,
    img_size: int,
    min_side: float = 12.0,
    max_side: float = 64.0,
) -> np.ndarray:
    """Draw one rotated rectangle that lies inside the image.

    Args:
        rng (np.random.Generator): The random generator.
        img_size (int): Image side in pixels.
        min_side (float): Smallest box side. Defaults to 12.
        max_side (float): Largest box side. Defaults to 64.

    Returns:
        np.ndarray: The 4 corners, shape (4, 2), float32.
    """
    w, h = rng.uniform(min_side, max_side, size=2)
    angle = rng.uniform(-90.0, 90.0)
    margin = 0.5 * np.hypot(w, h) + 1
    cx, cy = rng.uniform(margin, img_size - margin, size=2)
    return cv2.boxPoints(((cx, cy), (w, h), angle)).astype(np.float32)


def format_dota_line(
    corners: np.ndarray, class_name: str, difficulty: int = 0
) -> str:
    """Format one DOTA annotation line ``x1 y1 ... x4 y4 class difficulty``."""
    coords = ' '.join(f'{v:.1f}' for v in np.asarray(corners).reshape(-1))
    return f'{coords} {class_name} {difficulty}'


#: Kinds of planted errors (``generate_dota(broken=...)``).
BROKEN_KINDS = (
    'zero_width',
    'collapsed_quad',
    'nan_coordinate',
    'unknown_class',
    'negative_coordinate',
    'angle_pi_2',
)
#: The class name written by ``'unknown_class'``.
UNKNOWN_CLASS = 'flying-saucer'


def broken_line(kind: str, img_size: int, class_name: str) -> str:
    """One DOTA annotation line with the planted error ``kind``.

    Kinds: ``'zero_width'`` (a rotated box of width 0: two distinct
    corners), ``'collapsed_quad'`` (four distinct collinear corners),
    ``'nan_coordinate'`` (``x1`` is ``nan``), ``'unknown_class'`` (class
    :data:`UNKNOWN_CLASS`), ``'negative_coordinate'`` (a valid box crossing
    the left border), ``'angle_pi_2'`` (an axis-aligned rectangle, 20 wide
    and 40 tall: its long side is vertical, so in ``le90`` its angle is
    exactly on the boundary -pi/2 = pi/2; ``ConvertBoxType`` gives -pi/2).

    Args:
        kind (str): One of :data:`BROKEN_KINDS`.
        img_size (int): Image side in pixels (boxes sit near the centre).
        class_name (str): Class of the line (except ``'unknown_class'``).

    Returns:
        str: The line, without newline.

    Raises:
        ValueError: For an unknown ``kind``.
    """
    c = img_size / 2
    valid = cv2.boxPoints(((c, c), (30.0, 16.0), 30.0))
    if kind == 'zero_width':
        return format_dota_line(
            cv2.boxPoints(((c, c), (0.0, 30.0), 30.0)), class_name
        )
    if kind == 'collapsed_quad':
        pts = np.array(
            [
                [c - 15, c - 15],
                [c - 5, c - 5],
                [c + 5, c + 5],
                [c + 15, c + 15],
            ]
        )
        return format_dota_line(pts, class_name)
    if kind == 'nan_coordinate':
        line = format_dota_line(valid, class_name).split(' ')
        line[0] = 'nan'
        return ' '.join(line)
    if kind == 'unknown_class':
        return format_dota_line(valid, UNKNOWN_CLASS)
    if kind == 'negative_coordinate':
        return format_dota_line(
            cv2.boxPoints(((6.0, c), (30.0, 16.0), 30.0)), class_name
        )
    if kind == 'angle_pi_2':
        pts = np.array(
            [
                [c - 10, c - 20],
                [c + 10, c - 20],
                [c + 10, c + 20],
                [c - 10, c + 20],
            ]
        )
        return format_dota_line(pts, class_name)
    raise ValueError(
        f'unknown broken kind {kind!r}; expected one of ' f'{BROKEN_KINDS}'
    )


def generate_dota(
    root: str,
    num_images: int = 8,
    img_size: int = 256,
    objects_per_image: tuple = (2, 5),
    seed: int = 0,
    split: str = 'trainval',
    classes: Optional[tuple] = None,
    broken: Sequence[str] = (),
) -> Dict[str, List[Any]]:
    """Write a tiny DOTA-format split under ``root/split``.

    The same arguments always produce byte-identical files, and
    ``broken=()`` writes the same files as before ``broken`` existed.

    Args:
        root (str): Dataset root (``data_root`` in configs).
        num_images (int): Number of images. Defaults to 8.
        img_size (int): Image side in pixels. Defaults to 256.
        objects_per_image (tuple): Inclusive range of objects per image.
        seed (int): Random seed. Defaults to 0.
        split (str): Split folder name. Defaults to ``'trainval'``.
        classes (tuple, optional): Class names to draw from. Defaults to
            :data:`DOTA_CLASSES`.
        broken (Sequence[str]): Planted errors, kinds of
            :data:`BROKEN_KINDS` (see :func:`broken_line`). The k-th goes
            into image ``k % num_images``, inserted after its first valid
            line (not drawn into the image).

    Returns:
        dict: ``images`` and ``annfiles``, the written paths in order, and
        ``broken``: one dict per planted error with ``kind``, ``annfile``,
        ``image`` and ``line`` (1-based line number in ``annfile``).

    Raises:
        ValueError: For an unknown kind in ``broken``.
    """
    classes = classes or DOTA_CLASSES
    for kind in broken:
        if kind not in BROKEN_KINDS:
            raise ValueError(
                f'unknown broken kind {kind!r}; expected one of '
                f'{BROKEN_KINDS}'
            )
    rng = np.random.default_rng(seed)
    img_dir = osp.join(root, split, 'images')
    ann_dir = osp.join(root, split, 'annfiles')
    os.makedirs(img_dir, exist_ok=True)
    os.makedirs(ann_dir, exist_ok=True)
    written: Dict[str, List[Any]] = dict(images=[], annfiles=[], broken=[])
    for i in range(num_images):
        name = f'P{i:04d}'
        img = rng.integers(0, 60, size=(img_size, img_size, 3), dtype=np.uint8)
        lines = []
        for _ in range(
            rng.integers(objects_per_image[0], objects_per_image[1] + 1)
        ):
            corners = random_rotated_object(rng, img_size)
            label = int(rng.integers(len(classes)))
            color = [
                int(c) for c in 80 + (np.arange(3) * 37 + label * 53) % 170
            ]
            cv2.fillPoly(img, [np.round(corners).astype(np.int32)], color)
            lines.append(format_dota_line(corners, classes[label]))
        img_path = osp.join(img_dir, f'{name}.png')
        ann_path = osp.join(ann_dir, f'{name}.txt')
        cv2.imwrite(img_path, img)
        planted = [k for j, k in enumerate(broken) if j % num_images == i]
        at = min(1, len(lines))
        for j, kind in enumerate(planted):
            lines.insert(at + j, broken_line(kind, img_size, classes[0]))
            written['broken'].append(
                dict(
                    kind=kind,
                    annfile=ann_path,
                    image=img_path,
                    line=at + j + 1,
                )
            )
        with open(ann_path, 'w') as f:
            f.write('\n'.join(lines) + '\n')
        written['images'].append(img_path)
        written['annfiles'].append(ann_path)
    return written
