# Copyright (c) mmnanguard contributors. All rights reserved.
"""A data finding of :func:`~.batch_checks.check_batch` in words: where it
lives (the annotation file and the record in it, else the image) and what
is wrong, as ``report.md``, the log and the remedy say it."""

import os.path as osp
from typing import Any, Dict

#: Plain words for each check of :mod:`mmnanguard.datasets.checks`.
CHECK_WORDS = dict(
    image_finite='non-finite pixels',
    image_range='pixels of extreme magnitude (count, value)',
    hbox_finite='box with a non-finite coordinate (x1, y1, x2, y2)',
    hbox_size='zero-size box (x1, y1, x2, y2)',
    rbox_finite='rotated box with a non-finite value (cx, cy, w, h, t)',
    rbox_size='zero-size rotated box (cx, cy, w, h, t)',
    qbox_finite='quadrilateral with a non-finite coordinate',
    qbox_area='zero-area quadrilateral',
    label_range='label out of range',
    seg_values='stray segmentation values',
)


def _fmt_value(value: Any) -> str:
    return f'{value:.4g}' if isinstance(value, float) else str(value)


def record_place(found: Dict[str, Any], short: bool = False) -> str:
    """Where a finding lives: the annotation file and the record in it
    (DOTA line, VOC object, COCO annotation id, with the image), else the
    image or the segmentation map, else the batch sample.

    Args:
        found (dict): A finding of :func:`check_batch`.
        short (bool): File names without their folders, but for an
            annotation file's own folder (``Annotations/NAME.xml``,
            ``annotations/train.json``).
    """
    where = str(
        found.get('annfile')
        or found.get('img_path')
        or found.get('seg_map_path')
        or f"sample {found['sample']}"
    )
    if short:
        parent = osp.basename(osp.dirname(where))
        where = (
            osp.join(parent, osp.basename(where))
            if where.endswith(('.xml', '.json'))
            else osp.basename(where)
        )
    if found.get('line'):
        where += f" line {found['line']}"
    if found.get('object'):
        where += f" object {found['object']}"
    if found.get('ann_id') is not None:
        image = found.get('img_path')
        image = osp.basename(str(image)) if short and image else image
        where += f" annotation id {found['ann_id']}"
        if image:
            where += f' (image {image})'
    return where


def describe_finding(found: Dict[str, Any]) -> str:
    """One line: file (and record), instance, check, values, detail."""
    where = record_place(found, short=True)
    inst = '' if found.get('index') is None else f", instance {found['index']}"
    values = ', '.join(_fmt_value(v) for v in found.get('values', []))
    words = CHECK_WORDS.get(found['check'], found['check'])
    if str(found.get('detail', '')).startswith('inverted box'):
        words = words.replace('zero-size ', 'inverted ')
    side = found.get('clipped_at')
    if side:
        words = words.replace(
            'zero-size box',
            f'box outside the image, clipped to zero size at its {side} '
            'border',
        )
    if found['index'] is not None:  # an instance: show its values
        words += f' = ({values})'
    if side:
        height, width = found['img_shape']
        raw = found.get('raw')
        form = found.get('raw_form')
        shown = ', '.join(_fmt_value(v) for v in raw or [])
        annotated = (
            (
                f' (annotated as {form} = {shown})'
                if form
                else f' ({shown} as annotated)'
            )
            if raw
            else ''
        )
        words += (
            f' in the {width}x{height} image after the pipeline; the box'
            f'{annotated} lies outside the image'
        )
        declared = found.get('declared_shape')
        if declared:
            words += (
                f'; the annotation file declares the image '
                f'{declared[1]}x{declared[0]}, the file is '
                f"{found['ori_shape'][1]}x{found['ori_shape'][0]}"
            )
    return (
        f"{where} (batch sample {found['sample']}{inst}): {words}: "
        f"{found['detail']} [check {found['check']}]"
    )
