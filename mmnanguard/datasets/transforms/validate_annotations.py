# Copyright (c) mmnanguard contributors. All rights reserved.
"""``ValidateAnnotations``: catch the bad annotation before it is a NaN."""

import logging
from typing import Any, Dict, List, Optional

import numpy as np
from mmcv.transforms import BaseTransform
from mmengine.logging import print_log

from mmnanguard.registry import TRANSFORMS, register_shared

from ..checks import (
    IMAGE_CHECKS,
    Violation,
    check_boxes,
    check_image,
    check_labels,
    check_seg_map,
    stray_seg_values,
)
from ..dota_annfile import (
    ANN_FILE_KEY,
    ANN_LINES_KEY,
    annfile_beside,
    annfile_line_count,
)

#: Per-instance result keys that ``filter`` keeps aligned with the boxes.
INSTANCE_KEYS = (
    'gt_bboxes',
    'gt_bboxes_labels',
    'gt_ignore_flags',
    'gt_masks',
    'gt_instances_ids',
)
POLICIES = ('filter', 'raise', 'warn')


class InvalidAnnotationError(ValueError):
    """A sample failed :class:`ValidateAnnotations` under ``policy='raise'``
    (or a whole-image problem that ``filter`` cannot drop per instance)."""


def sample_source(results: Dict[str, Any]) -> str:
    """The files a sample comes from: image path, then annotation path
    (a segmentation map, or VOC's ``Annotations/*.xml``)."""
    parts = [
        str(results[k])
        for k in ('img_path', 'seg_map_path', 'xml_path')
        if results.get(k) is not None
    ]
    return ' / '.join(parts) or f'sample {results.get("sample_idx", "?")}'


def _annfile_line(results: Dict[str, Any], violation: Violation) -> str:
    """Where a DOTA instance's line is: `` (annfile X, line N)``; '' for
    other samples. The line is told where the sample still has one
    instance per annfile line (``DOTADataset`` reads them in order); the
    annfile alone otherwise."""
    if violation.index is None:
        return ''
    annfile = results.get(ANN_FILE_KEY)
    lines = results.get(ANN_LINES_KEY)
    if annfile is not None and lines is not None:
        if violation.index < len(lines):
            return f' (annfile {annfile}, line {lines[violation.index]})'
    annfile = annfile_beside(results.get('img_path'))
    if not annfile:
        return ''
    boxes = results.get('gt_bboxes')
    if boxes is not None and len(boxes) == annfile_line_count(annfile):
        return f' (annfile {annfile}, line {violation.index + 1})'
    return f' (annfile {annfile})'


def check_results(
    results: Dict[str, Any],
    num_classes: Optional[int],
    min_size: float = 1.0,
    angle_version: Optional[str] = None,
    angle_tol: float = 1e-6,
    ignore_index: int = 255,
    check_img: bool = True,
    negative_coords: bool = False,
) -> List[Violation]:
    """Run every check that applies to a pipeline ``results`` dict.

    Args:
        results (dict): Pipeline results (``img``, ``gt_bboxes``,
            ``gt_bboxes_labels``, ``gt_seg_map`` where present).
        num_classes (int, optional): Labels and segmentation values must
            be below it. None: their range is not checked (a dataset that
            names no classes).
        min_size (float): Box sides (quadrilateral: square root of the
            area) must be strictly above it. Defaults to 1.
        angle_version (str, optional): Rotated boxes' angle version;
            ``None`` skips the angle check.
        angle_tol (float): Angle boundary tolerance in radians.
        ignore_index (int): Allowed extra segmentation value.
        check_img (bool): Check that the image is finite and free of
            extreme (NoData) pixels.
        negative_coords (bool): Flag box corners left of or above the
            image, and boxes wholly outside it (meaningful before
            augmentation).

    Returns:
        list[Violation]: All violations, sample-level first.
    """
    out: List[Violation] = []
    if check_img and results.get('img') is not None:
        out += check_image(results['img'])
    if results.get('gt_seg_map') is not None and num_classes is not None:
        out += check_seg_map(results['gt_seg_map'], num_classes, ignore_index)
    if results.get('gt_bboxes') is not None:
        out += check_boxes(
            results['gt_bboxes'],
            min_size,
            angle_version,
            angle_tol,
            negative_coords,
            results.get('img_shape') if negative_coords else None,
        )
    if results.get('gt_bboxes_labels') is not None and num_classes is not None:
        out += check_labels(results['gt_bboxes_labels'], num_classes)
    return out


def drop_instances(results: Dict[str, Any], drop: List[int]) -> None:
    """Remove instances ``drop`` from every per-instance key, in place."""
    num = len(results['gt_bboxes'])
    keep = np.ones(num, dtype=bool)
    keep[drop] = False
    for key in INSTANCE_KEYS:
        value = results.get(key)
        if value is None:
            continue
        if len(value) != num:
            raise ValueError(
                f'results[{key!r}] has {len(value)} entries but '
                f'gt_bboxes has {num}; cannot filter '
                f'{sample_source(results)} consistently'
            )
        if key == 'gt_masks':
            results[key] = value[np.flatnonzero(keep)]
        else:
            results[key] = value[keep]


@register_shared(TRANSFORMS)
class ValidateAnnotations(BaseTransform):
    """Check images, boxes, labels and segmentation maps of a sample.

    Place it after the augmentations (crops and rotations create degenerate
    boxes) and before the ``Pack*Inputs`` transform. The checks are those of
    :mod:`mmnanguard.datasets.checks`: a finite image without extreme
    (NoData) pixels; horizontal boxes finite
    with ``w, h > min_size``; ``RotatedBoxes`` finite with ``w, h >
    min_size`` and the angle strictly inside the ``angle_version`` range,
    taken in that version's representation as mmrotate's coders regularize
    it (a ``le90`` box whose long side is exactly vertical sits on the
    ``-pi/2 = pi/2`` boundary and fails; see
    :func:`~mmnanguard.datasets.checks.angle_violations`);
    ``QuadriBoxes`` finite with area ``> min_size ** 2``; labels in
    ``[0, num_classes)``; segmentation values in ``[0, num_classes)`` or
    ``ignore_index``.

    Policies:

    - ``'filter'``: drop the invalid instances with their labels, ignore
      flags, masks and instance ids; keep the sample. Stray segmentation
      pixels are set to ``ignore_index``. A non-finite image, or one with
      extreme pixels, cannot be repaired per instance: the transform
      returns ``None`` and the dataset fetches another sample (mmengine's
      ``max_refetch``). Every drop is
      logged as a warning through the current ``MMLogger`` (so it reaches
      the runner's text log) with the file, the checks and the running
      totals :attr:`num_dropped_instances`, :attr:`num_masked_pixels`,
      :attr:`num_dropped_samples` (per process: each dataloader worker
      counts its own samples).
    - ``'raise'``: raise :class:`InvalidAnnotationError` naming the file,
      the instance indices, the bad values and the failed checks.
    - ``'warn'``: log the same message as a warning and keep the sample
      unchanged.

    Args:
        num_classes (int): Number of classes of the model.
        policy (str): ``'filter'``, ``'raise'`` or ``'warn'``. Defaults to
            ``'filter'``.
        min_size (float): Minimal box side in pixels. Defaults to 1.
        angle_version (str, optional): ``'oc'``, ``'le90'`` or ``'le135'``
            for rotated boxes; ``None`` skips the angle check. Defaults to
            ``None``.
        angle_tol (float): Angle boundary tolerance in radians. Defaults to
            1e-6.
        ignore_index (int): Allowed extra segmentation value. Defaults to
            255.
        check_img (bool): Check that the image is finite. Defaults to True.
        negative_coords (bool): Also flag box corners with a negative
            coordinate, and boxes wholly outside the image. Defaults to
            False (rotations legitimately push corners out of the image).

    Example:
        >>> train_pipeline = [
        ...     ...,
        ...     dict(type='mmdet.RandomFlip', prob=0.5),
        ...     dict(type='ValidateAnnotations', num_classes=15,
        ...          angle_version='le90', policy='filter'),
        ...     dict(type='mmdet.PackDetInputs')
        ... ]
    """

    def __init__(
        self,
        num_classes: int,
        policy: str = 'filter',
        min_size: float = 1.0,
        angle_version: Optional[str] = None,
        angle_tol: float = 1e-6,
        ignore_index: int = 255,
        check_img: bool = True,
        negative_coords: bool = False,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(
                f'policy must be one of {POLICIES}, got ' f'{policy!r}'
            )
        if not isinstance(num_classes, int) or num_classes <= 0:
            raise ValueError(
                f'num_classes must be a positive int, got ' f'{num_classes!r}'
            )
        if min_size < 0:
            raise ValueError(f'min_size must be >= 0, got {min_size!r}')
        self.num_classes = num_classes
        self.policy = policy
        self.min_size = float(min_size)
        self.angle_version = angle_version
        self.angle_tol = float(angle_tol)
        self.ignore_index = ignore_index
        self.check_img = check_img
        self.negative_coords = negative_coords
        self.num_dropped_instances = 0
        self.num_masked_pixels = 0
        self.num_dropped_samples = 0
        self.num_invalid_samples = 0

    def check(self, results: Dict[str, Any]) -> List[Violation]:
        """The violations of ``results`` under this transform's settings."""
        return check_results(
            results,
            num_classes=self.num_classes,
            min_size=self.min_size,
            angle_version=self.angle_version,
            angle_tol=self.angle_tol,
            ignore_index=self.ignore_index,
            check_img=self.check_img,
            negative_coords=self.negative_coords,
        )

    def transform(self, results: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """Check ``results`` and apply the policy.

        Args:
            results (dict): Pipeline results.

        Returns:
            dict or None: The (filtered) results; ``None`` when ``filter``
            drops the whole sample.

        Raises:
            InvalidAnnotationError: Under ``raise``, for any violation.
        """
        violations = self.check(results)
        if not violations:
            return results
        self.num_invalid_samples += 1
        source = sample_source(results)
        report = '\n  '.join(
            v.describe() + _annfile_line(results, v) for v in violations
        )
        if self.policy == 'raise':
            raise InvalidAnnotationError(
                f'ValidateAnnotations: {len(violations)} failed check(s) in '
                f'{source}:\n  {report}'
            )
        if self.policy == 'warn':
            print_log(
                f'ValidateAnnotations(policy=warn): kept {source} with '
                f'{len(violations)} failed check(s):\n  {report}',
                logger='current',
                level=logging.WARNING,
            )
            return results
        return self._filter(results, violations, source, report)

    def _filter(
        self,
        results: Dict[str, Any],
        violations: List[Violation],
        source: str,
        report: str,
    ) -> Optional[Dict[str, Any]]:
        if any(v.check in IMAGE_CHECKS for v in violations):
            self.num_dropped_samples += 1
            print_log(
                f'ValidateAnnotations(policy=filter): dropped sample '
                f'{source} (non-finite or extreme pixels; the dataset '
                f'refetches another);'
                f' dropped samples so far: {self.num_dropped_samples}\n  '
                f'{report}',
                logger='current',
                level=logging.WARNING,
            )
            return None
        masked = 0
        if any(v.check == 'seg_values' for v in violations):
            seg = results['gt_seg_map']
            stray = stray_seg_values(seg, self.num_classes, self.ignore_index)
            masked = int(stray.sum())
            seg = seg.copy()
            seg[stray] = self.ignore_index
            results['gt_seg_map'] = seg
        drop = sorted({v.index for v in violations if v.index is not None})
        if drop:
            drop_instances(results, drop)
        self.num_dropped_instances += len(drop)
        self.num_masked_pixels += masked
        print_log(
            f'ValidateAnnotations(policy=filter): dropped {len(drop)} '
            f'invalid instance(s) {drop} and set {masked} stray segmentation '
            f'pixel(s) to {self.ignore_index} in {source}; so far '
            f'nanguard_invalid_instances={self.num_dropped_instances}, '
            f'nanguard_masked_pixels={self.num_masked_pixels}\n  {report}',
            logger='current',
            level=logging.WARNING,
        )
        return results

    def __repr__(self) -> str:
        return (
            f'{self.__class__.__name__}(num_classes={self.num_classes}, '
            f'policy={self.policy!r}, min_size={self.min_size}, '
            f'angle_version={self.angle_version!r}, '
            f'angle_tol={self.angle_tol}, '
            f'ignore_index={self.ignore_index}, '
            f'check_img={self.check_img}, '
            f'negative_coords={self.negative_coords})'
        )
