# Copyright (c) mmnanguard contributors. All rights reserved.
"""Annotation checks shared by ``ValidateAnnotations``, the guard's
diagnosis and ``tools/check_dataset.py``.

Every check takes plain arrays (or mmdet ``BaseBoxes``) and returns a list of
:class:`Violation`, one per failing instance and check (or one per sample for
image and segmentation-map checks). The checks are vectorised: a sample
without problems allocates no :class:`Violation`.

Check names (``Violation.check``):

====================  ==================================================
``image_finite``      every pixel of a floating image is finite
``image_range``       no pixel of a floating image has a magnitude of
                      :data:`EXTREME_PIXEL` or more (a NoData sentinel)
``hbox_finite``       horizontal box ``(x1, y1, x2, y2)`` is finite
``hbox_size``         ``x2 - x1 > min_size`` and ``y2 - y1 > min_size``
                      (a negative side is told as an inverted box)
``rbox_finite``       rotated box ``(cx, cy, w, h, t)`` is finite
``rbox_size``         ``w > min_size`` and ``h > min_size``
``rbox_angle``        ``t`` (in the version's representation) strictly
                      inside the angle version's range
``qbox_finite``       quadrilateral ``(x1, y1, ..., x4, y4)`` is finite
``qbox_area``         shoelace area ``> min_size ** 2``
``negative_coord``    no box corner has a coordinate below 0
``outside_image``     a box does not lie wholly beyond one border of the
                      image (the pipeline clips it to zero size)
``label_range``       ``0 <= label < num_classes``
``seg_values``        every pixel in ``[0, num_classes)`` or
                      ``ignore_index``
====================  ==================================================
"""

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

#: Angle range ``[low, high)`` of each mmrotate angle version, in radians,
#: as ``RotatedBoxes.regularize_boxes`` and ``norm_angle`` define them.
ANGLE_RANGES: Dict[str, Tuple[float, float]] = {
    'oc': (-math.pi / 2, 0.0),
    'le90': (-math.pi / 2, math.pi / 2),
    'le135': (-math.pi / 4, 3 * math.pi / 4),
}


#: The pixel magnitude from which an image is refused: its square passes
#: the float32 range, so a BatchNorm variance or an L2 norm of it
#: overflows. GDAL's float32 NoData value (-3.4e38) is far above it; a
#: uint16 or a reflectance image is far below.
EXTREME_PIXEL = math.sqrt(float(np.finfo(np.float32).max))
#: The checks of a whole image: a sample failing one is dropped whole.
IMAGE_CHECKS = ('image_finite', 'image_range')


@dataclass(frozen=True)
class Violation:
    """One failed check.

    Args:
        check (str): Name of the failed check, e.g. ``'rbox_size'``.
        index (int, optional): Instance index in the sample, ``None`` for
            checks on the whole image or segmentation map.
        values (tuple): The offending values (a box, a label, the stray
            segmentation values).
        detail (str): Why the values fail, e.g. ``'w=0 <= min_size=1'``.
    """

    check: str
    index: Optional[int]
    values: Tuple[Any, ...]
    detail: str

    def describe(self) -> str:
        """One line naming the check, the instance and the bad values."""
        where = 'sample' if self.index is None else f'instance {self.index}'
        values = ', '.join(_fmt(v) for v in self.values)
        return f'{self.check} failed for {where}: ({values}); {self.detail}'

    def to_dict(self) -> Dict[str, Any]:
        """JSON-ready form (non-finite floats become strings)."""
        return dict(
            check=self.check,
            index=self.index,
            values=[_jsonable(v) for v in self.values],
            detail=self.detail,
        )


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f'{value:.6g}'
    return str(value)


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def as_array(boxes: Any, dim: Optional[int] = None) -> np.ndarray:
    """Boxes as a float64 array of shape ``(N, D)``.

    Args:
        boxes: ``BaseBoxes`` (mmdet/mmrotate), a tensor, an array or a
            sequence of boxes.
        dim (int, optional): Expected box dimension (4, 5 or 8).

    Returns:
        np.ndarray: float64, shape ``(N, D)``.

    Raises:
        ValueError: If the last dimension is not ``dim``.
    """
    data = getattr(boxes, 'tensor', boxes)
    if hasattr(data, 'detach'):
        data = data.detach().cpu().numpy()
    arr = np.asarray(data, dtype=np.float64)
    if arr.size == 0:
        return arr.reshape(0, dim or (arr.shape[-1] if arr.ndim else 0))
    if arr.ndim != 2 or (dim is not None and arr.shape[1] != dim):
        raise ValueError(
            f'expected boxes of shape (N, {dim}), got an array '
            f'of shape {arr.shape}'
        )
    return arr


def _row_violations(
    check: str,
    bad: np.ndarray,
    boxes: np.ndarray,
    detail: Callable[[int], str],
) -> List[Violation]:
    """One violation per row of ``bad``; ``detail(i)`` explains row i."""
    if not bad.any():
        return []
    return [
        Violation(check, i, tuple(float(v) for v in boxes[i]), detail(i))
        for i in np.flatnonzero(bad).tolist()
    ]


def check_image(img: np.ndarray) -> List[Violation]:
    """``image_finite``: a floating image holds no NaN or infinity;
    ``image_range``: nor a finite pixel of magnitude :data:`EXTREME_PIXEL`
    or more (GDAL's NoData value -3.4e38 in a float32 tile).

    Integer images are finite and in range by construction and cost
    nothing.

    Args:
        img (np.ndarray): The image, any shape.

    Returns:
        list[Violation]: Empty, or one sample-level violation: for
        ``image_finite`` the counts of NaN, +inf and -inf pixels; for
        ``image_range`` the count of extreme pixels and the largest
        magnitude's value.
    """
    img = np.asarray(img)
    if not np.issubdtype(img.dtype, np.floating):
        return []
    finite = np.isfinite(img)
    if finite.all():
        magnitude = np.abs(img)
        extreme = magnitude >= EXTREME_PIXEL
        if not extreme.any():
            return []
        count = int(extreme.sum())
        value = float(img.reshape(-1)[np.argmax(magnitude)])
        return [
            Violation(
                'image_range',
                None,
                (count, value),
                f'image of shape {img.shape} has {count} finite pixels of '
                f'magnitude >= {EXTREME_PIXEL:.3g} (up to {value:.4g}, a '
                'NoData value?); their square overflows float32 '
                '(BatchNorm variance, norms)',
            )
        ]
    counts = (
        int(np.isnan(img).sum()),
        int(np.isposinf(img).sum()),
        int(np.isneginf(img).sum()),
    )
    return [
        Violation(
            'image_finite',
            None,
            counts,
            f'image of shape {img.shape} has {counts[0]} NaN, '
            f'{counts[1]} +inf and {counts[2]} -inf values',
        )
    ]


def _finite_rows(check: str, boxes: np.ndarray) -> Tuple[np.ndarray, list]:
    finite = np.isfinite(boxes).all(axis=1)
    bad = ~finite
    return finite, _row_violations(
        check, bad, boxes, lambda i: 'non-finite coordinate'
    )


def check_hboxes(boxes: Any, min_size: float) -> List[Violation]:
    """``hbox_finite`` and ``hbox_size`` for ``(x1, y1, x2, y2)`` boxes.

    Args:
        boxes: Horizontal boxes, shape ``(N, 4)``.
        min_size (float): Width and height must be strictly above it.

    Returns:
        list[Violation]: One per failing instance and check.
    """
    boxes = as_array(boxes, 4)
    finite, out = _finite_rows('hbox_finite', boxes)
    w = boxes[:, 2] - boxes[:, 0]
    h = boxes[:, 3] - boxes[:, 1]
    bad = finite & ~((w > min_size) & (h > min_size))
    return out + _row_violations(
        'hbox_size', bad, boxes, lambda i: _size_detail(w[i], h[i], min_size)
    )


def _size_detail(w: float, h: float, min_size: float) -> str:
    """Why a box's size fails; a negative side is an inverted box (its
    max below its min), the mark of a box written as ``x, y, w, h``."""
    inverted = [
        f'{hi} < {lo} ({side}={value:.6g})'
        for side, value, lo, hi in (
            ('w', w, 'xmin', 'xmax'),
            ('h', h, 'ymin', 'ymax'),
        )
        if value < 0
    ]
    if inverted:
        return (
            f'inverted box: {" and ".join(inverted)}; the box looks written '
            'as x, y, w, h where x1, y1, x2, y2 (VOC: xmin, ymin, xmax, '
            'ymax) is expected'
        )
    return f'w={w:.6g}, h={h:.6g}, need both > min_size={min_size}'


def regularize_rboxes(boxes: np.ndarray, angle_version: str) -> np.ndarray:
    """``(w, h, t)`` of rotated boxes in the angle version's representation.

    The float64 counterpart of mmrotate's
    ``RotatedBoxes.regularize_boxes(pattern)``: ``le90`` and ``le135`` make
    the width the longer side and take ``t`` into ``[low, low + pi)``;
    ``oc`` keeps ``t`` in ``[-pi/2, 0)`` and swaps the sides instead.

    Args:
        boxes (np.ndarray): Rotated boxes, shape ``(N, 5)``.
        angle_version (str): ``'oc'``, ``'le90'`` or ``'le135'``.

    Returns:
        np.ndarray: ``(N, 3)`` regularized width, height, angle.

    Raises:
        ValueError: For an unknown ``angle_version``.
    """
    if angle_version not in ANGLE_RANGES:
        raise ValueError(
            f'angle_version must be one of '
            f'{sorted(ANGLE_RANGES)}, got {angle_version!r}'
        )
    low = ANGLE_RANGES[angle_version][0]
    w, h, t = boxes[:, 2], boxes[:, 3], boxes[:, 4]
    if angle_version == 'oc':
        t = np.mod(t - low, np.pi)
        keep = t < np.pi / 2
        w_, h_ = np.where(keep, w, h), np.where(keep, h, w)
        t = np.where(keep, t, t - np.pi / 2) + low
    else:
        keep = w > h
        w_, h_ = np.where(keep, w, h), np.where(keep, h, w)
        t = np.where(keep, t, t + np.pi / 2)
        t = np.mod(t - low, np.pi) + low
    return np.stack([w_, h_, t], axis=1)


def angle_violations(
    boxes: np.ndarray, angle_version: str, angle_tol: float
) -> np.ndarray:
    """Which rotated boxes sit on the boundary of the version's range.

    The angle is taken in the version's own representation
    (:func:`regularize_rboxes`, as mmrotate's box coders do before
    encoding), where it lies in ``[low, high)``; a box fails when it is
    within ``angle_tol`` of ``low`` or ``high``. Such a box has two
    representations at opposite ends of the range (``-pi/2`` and ``pi/2``
    in ``le90``: a box whose long side is exactly vertical), and its angle
    target jumps between them.

    Raw pipeline angles are not compared with the range: mmrotate 1.x does
    not regularize in the data pipeline (``ConvertBoxType`` returns
    OpenCV's ``minAreaRect`` angle, in ``[-pi/2, 0)`` with OpenCV 5, and
    ``Rotate`` adds the rotation without wrapping), so raw angles outside
    the range are normal there.

    Args:
        boxes (np.ndarray): Finite rotated boxes, shape ``(N, 5)``.
        angle_version (str): ``'oc'``, ``'le90'`` or ``'le135'``.
        angle_tol (float): Boundary tolerance in radians.

    Returns:
        np.ndarray: Boolean mask of failing boxes.
    """
    low, high = ANGLE_RANGES[angle_version]
    t = regularize_rboxes(boxes, angle_version)[:, 2]
    return (t <= low + angle_tol) | (t >= high - angle_tol)


def check_rboxes(
    boxes: Any,
    min_size: float,
    angle_version: Optional[str] = None,
    angle_tol: float = 1e-6,
) -> List[Violation]:
    """``rbox_finite``, ``rbox_size`` and ``rbox_angle`` for
    ``(cx, cy, w, h, t)`` boxes.

    Args:
        boxes: Rotated boxes, shape ``(N, 5)``, angle in radians.
        min_size (float): ``w`` and ``h`` must be strictly above it.
        angle_version (str, optional): Check that the angle is strictly
            inside this version's range (see :func:`angle_violations`).
            ``None`` skips the angle check.
        angle_tol (float): Boundary tolerance in radians. Defaults to 1e-6.

    Returns:
        list[Violation]: One per failing instance and check.

    Raises:
        ValueError: For an unknown ``angle_version``.
    """
    boxes = as_array(boxes, 5)
    finite, out = _finite_rows('rbox_finite', boxes)
    w, h = boxes[:, 2], boxes[:, 3]
    bad = finite & ~((w > min_size) & (h > min_size))
    out += _row_violations(
        'rbox_size',
        bad,
        boxes,
        lambda i: (
            f'w={w[i]:.6g}, h={h[i]:.6g}, need both > min_size={min_size}'
        ),
    )
    if angle_version is not None:
        if angle_version not in ANGLE_RANGES:
            raise ValueError(
                f'angle_version must be one of '
                f'{sorted(ANGLE_RANGES)}, got {angle_version!r}'
            )
        low, high = ANGLE_RANGES[angle_version]
        with np.errstate(invalid='ignore'):  # non-finite rows: see above
            reg = regularize_rboxes(boxes, angle_version)
        t = reg[:, 2]
        bad = finite & ((t <= low + angle_tol) | (t >= high - angle_tol))
        out += _row_violations(
            'rbox_angle',
            bad,
            boxes,
            lambda i: (
                f'as {angle_version}: w={reg[i, 0]:.6g}, h={reg[i, 1]:.6g}, '
                f't={reg[i, 2]:.9g} rad, on the boundary of [{low:.9g}, '
                f'{high:.9g}) (tolerance {angle_tol})'
            ),
        )
    return out


def quad_areas(boxes: np.ndarray) -> np.ndarray:
    """Shoelace areas of ``(N, 8)`` quadrilaterals, float64."""
    x, y = boxes[:, 0::2], boxes[:, 1::2]
    cross = x * np.roll(y, -1, axis=1) - np.roll(x, -1, axis=1) * y
    return 0.5 * np.abs(cross.sum(axis=1))


def check_qboxes(boxes: Any, min_size: float) -> List[Violation]:
    """``qbox_finite`` and ``qbox_area`` for ``(x1, y1, ..., x4, y4)``.

    Args:
        boxes: Quadrilaterals, shape ``(N, 8)``.
        min_size (float): The area must be strictly above ``min_size ** 2``.

    Returns:
        list[Violation]: One per failing instance and check.
    """
    boxes = as_array(boxes, 8)
    finite, out = _finite_rows('qbox_finite', boxes)
    areas = np.zeros(len(boxes))
    areas[finite] = quad_areas(boxes[finite])
    bad = finite & ~(areas > min_size**2)
    return out + _row_violations(
        'qbox_area',
        bad,
        boxes,
        lambda i: (
            f'area={areas[i]:.6g}, need > min_size**2={min_size**2:.6g}'
        ),
    )


def box_corners(boxes: np.ndarray) -> np.ndarray:
    """Corners ``(N, 4, 2)`` of hbox, rbox or qbox arrays (by width)."""
    if boxes.shape[1] == 4:
        x1, y1, x2, y2 = boxes.T
        return np.stack([x1, y1, x2, y1, x2, y2, x1, y2], 1).reshape(-1, 4, 2)
    if boxes.shape[1] == 5:
        ctr, w, h, t = boxes[:, :2], boxes[:, 2], boxes[:, 3], boxes[:, 4]
        vec1 = np.stack([w / 2 * np.cos(t), w / 2 * np.sin(t)], 1)
        vec2 = np.stack([-h / 2 * np.sin(t), h / 2 * np.cos(t)], 1)
        return np.stack(
            [
                ctr + vec1 + vec2,
                ctr + vec1 - vec2,
                ctr - vec1 - vec2,
                ctr - vec1 + vec2,
            ],
            1,
        )
    if boxes.shape[1] == 8:
        return boxes.reshape(-1, 4, 2)
    raise ValueError(
        f'boxes must have 4, 5 or 8 columns, got ' f'{boxes.shape[1]}'
    )


def check_negative_coords(
    boxes: Any, tolerance: float = 0.0
) -> List[Violation]:
    """``negative_coord``: no corner of a finite box lies left of or above
    the image (coordinate below ``-tolerance``).

    Args:
        boxes: Boxes of width 4 (hbox), 5 (rbox) or 8 (qbox).
        tolerance (float): Allowed overshoot in pixels. Defaults to 0.

    Returns:
        list[Violation]: One per failing instance.
    """
    boxes = as_array(boxes)
    if len(boxes) == 0:
        return []
    finite = np.isfinite(boxes).all(axis=1)
    corners = box_corners(np.where(finite[:, None], boxes, 0.0))
    lowest = corners.min(axis=1)
    bad = finite & (lowest < -tolerance).any(axis=1)
    return _row_violations(
        'negative_coord',
        bad,
        boxes,
        lambda i: (
            f'lowest corner x={lowest[i, 0]:.6g}, y={lowest[i, 1]:.6g}, '
            f'below {0.0 - tolerance:g}'
        ),
    )


def check_outside_image(
    boxes: Any, img_shape: Tuple[int, int]
) -> List[Violation]:
    """``outside_image``: a finite box whose corners all lie on or beyond
    one border of the image (left of 0, right of the width, above 0, below
    the height). mmdet clips boxes to the image on ``Resize`` and crops
    (``clip_object_border``), so such a box becomes one of zero width or
    height.

    Args:
        boxes: Boxes of width 4 (hbox), 5 (rbox) or 8 (qbox).
        img_shape (tuple[int, int]): ``(height, width)`` of the image the
            boxes are given in.

    Returns:
        list[Violation]: One per failing instance, naming the side.
    """
    boxes = as_array(boxes)
    if len(boxes) == 0:
        return []
    height, width = float(img_shape[0]), float(img_shape[1])
    finite = np.isfinite(boxes).all(axis=1)
    corners = box_corners(np.where(finite[:, None], boxes, 0.0))
    low, high = corners.min(axis=1), corners.max(axis=1)
    sides = [
        ('right of', low[:, 0] >= width, lambda i: f'x >= {low[i, 0]:.6g}'),
        ('left of', high[:, 0] <= 0, lambda i: f'x <= {high[i, 0]:.6g}'),
        ('below', low[:, 1] >= height, lambda i: f'y >= {low[i, 1]:.6g}'),
        ('above', high[:, 1] <= 0, lambda i: f'y <= {high[i, 1]:.6g}'),
    ]
    bad = np.zeros(len(boxes), dtype=bool)
    for _, beyond, _ in sides:
        bad |= beyond
    bad &= finite

    def detail(i: int) -> str:
        side, _, where = next(s for s in sides if s[1][i])
        return (
            f'the box lies {side} the {width:g}x{height:g} image '
            f'({where(i)}): the pipeline clips it to zero size'
        )

    return _row_violations('outside_image', bad, boxes, detail)


def check_boxes(
    boxes: Any,
    min_size: float,
    angle_version: Optional[str] = None,
    angle_tol: float = 1e-6,
    negative_coords: bool = False,
    img_shape: Optional[Tuple[int, int]] = None,
) -> List[Violation]:
    """Run the box checks that match the box width (4, 5 or 8).

    Args:
        boxes: ``HorizontalBoxes``/``RotatedBoxes``/``QuadriBoxes``, or an
            array of shape ``(N, 4|5|8)``.
        min_size (float): See :func:`check_hboxes`, :func:`check_rboxes`,
            :func:`check_qboxes`.
        angle_version (str, optional): For rotated boxes.
        angle_tol (float): For rotated boxes.
        negative_coords (bool): Also run :func:`check_negative_coords`.
        img_shape (tuple[int, int], optional): ``(height, width)``: also
            run :func:`check_outside_image` (meaningful as loaded, before
            the pipeline clips).

    Returns:
        list[Violation]: The violations, in check order.

    Raises:
        ValueError: For another box width.
    """
    arr = as_array(boxes)
    width = arr.shape[1] if arr.ndim == 2 else 0
    if width == 4:
        out = check_hboxes(arr, min_size)
    elif width == 5:
        out = check_rboxes(arr, min_size, angle_version, angle_tol)
    elif width == 8:
        out = check_qboxes(arr, min_size)
    elif arr.size == 0:
        return []
    else:
        raise ValueError(
            f'boxes must have 4, 5 or 8 columns, got an array '
            f'of shape {arr.shape}'
        )
    if negative_coords:
        out += check_negative_coords(arr)
    if img_shape is not None:
        out += check_outside_image(arr, img_shape)
    return out


def check_labels(labels: Any, num_classes: int) -> List[Violation]:
    """``label_range``: every label in ``[0, num_classes)``.

    Args:
        labels: Integer labels, shape ``(N,)``.
        num_classes (int): Number of classes of the model.

    Returns:
        list[Violation]: One per failing instance.
    """
    if hasattr(labels, 'detach'):
        labels = labels.detach().cpu().numpy()
    labels = np.asarray(labels).reshape(-1)
    bad = (labels < 0) | (labels >= num_classes)
    if not bad.any():
        return []
    return [
        Violation(
            'label_range',
            int(i),
            (int(labels[i]),),
            f'label {int(labels[i])} not in [0, {num_classes})',
        )
        for i in np.flatnonzero(bad)
    ]


def stray_seg_values(
    seg_map: np.ndarray, num_classes: int, ignore_index: int
) -> np.ndarray:
    """Mask of pixels outside ``[0, num_classes) U {ignore_index}``."""
    return ((seg_map < 0) | (seg_map >= num_classes)) & (
        seg_map != ignore_index
    )


def check_seg_map(
    seg_map: Any, num_classes: int, ignore_index: int = 255
) -> List[Violation]:
    """``seg_values``: a segmentation map holds class ids or
    ``ignore_index`` only.

    Args:
        seg_map: Integer map, any shape.
        num_classes (int): Number of classes.
        ignore_index (int): The ignored value. Defaults to 255.

    Returns:
        list[Violation]: Empty, or one sample-level violation whose values
        are the stray values (sorted), with their pixel counts in
        ``detail``.
    """
    seg = np.asarray(seg_map)
    if seg.dtype == np.uint8:
        counts = np.bincount(seg.reshape(-1), minlength=256)
        values = np.arange(256)
        keep = counts > 0
        values, counts = values[keep], counts[keep]
    else:
        values, counts = np.unique(seg, return_counts=True)
    bad = stray_seg_values(values, num_classes, ignore_index)
    if not bad.any():
        return []
    stray = tuple(int(v) for v in values[bad])
    pixels = ', '.join(f'{v}: {int(c)} px' for v, c in zip(stray, counts[bad]))
    return [
        Violation(
            'seg_values',
            None,
            stray,
            f'values outside [0, {num_classes}) and ignore_index='
            f'{ignore_index} ({pixels})',
        )
    ]
