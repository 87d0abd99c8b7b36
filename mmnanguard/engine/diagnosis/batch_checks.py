# Copyright (c) mmnanguard contributors. All rights reserved.
"""Check the data of one batch: pixels, boxes, labels, segmentation maps.

The checks themselves are those of :mod:`mmnanguard.datasets.checks`
(shared with ``ValidateAnnotations`` and ``tools/check_dataset.py``); this
module applies them to a batch as the model received it (``inputs`` and
``data_samples``) and names the file, the instance and, for DOTA annfiles,
the line each problem comes from.
"""

import os.path as osp
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn

from mmnanguard.datasets.annotation_records import (
    CocoRecord,
    coco_annotation,
    voc_object_box,
    voc_object_index,
)
from mmnanguard.datasets.checks import (
    check_boxes,
    check_image,
    check_labels,
    check_seg_map,
)
from mmnanguard.datasets.dota_annfile import parse_dota_annfile

from ..incident.batch_layout import (
    SOURCE_KEYS,
    sample_records,
    sample_sources,
)


def model_classes(model: nn.Module) -> Tuple[Optional[int], int]:
    """``(num_classes, ignore_index)`` of the model's first head.

    mmdet/mmrotate heads (``bbox_head``, ``rpn_head``, ``roi_head``...) and
    mmseg's ``decode_head`` carry ``num_classes``; mmseg's also carries
    ``ignore_index`` (default 255).

    Args:
        model (nn.Module): The model.

    Returns:
        tuple: ``(num_classes or None, ignore_index)``.
    """
    for name, module in model.named_modules():
        num = getattr(module, 'num_classes', None)
        if isinstance(num, int) and num > 0 and 'rpn' not in name:
            return num, int(getattr(module, 'ignore_index', 255) or 255)
    return None, 255


def _annotation_beside(
    img_path: Optional[str], folder: str, suffix: str
) -> Optional[str]:
    """``ROOT/FOLDER/NAME.SUFFIX`` for ``ROOT/IMAGES/NAME.EXT`` (an image's
    own annotation file in a sibling folder), when that file exists."""
    if not img_path:
        return None
    root = osp.dirname(osp.dirname(img_path))
    name = osp.splitext(osp.basename(img_path))[0]
    path = osp.join(root, folder, f'{name}{suffix}')
    return path if osp.isfile(path) else None


def dota_annfile_of(img_path: Optional[str]) -> Optional[str]:
    """``ROOT/SPLIT/annfiles/NAME.txt`` for ``ROOT/SPLIT/images/NAME.png``,
    when that file exists."""
    return _annotation_beside(img_path, 'annfiles', '.txt')


def voc_xml_of(img_path: Optional[str]) -> Optional[str]:
    """``ROOT/Annotations/NAME.xml`` for ``ROOT/JPEGImages/NAME.jpg`` (the
    VOC layout, where each image's boxes are in its own xml), when that
    file exists."""
    return _annotation_beside(img_path, 'Annotations', '.xml')


def annfile_line(
    annfile: str, index: int, num_instances: int, classes: Optional[Any] = None
) -> Optional[int]:
    """The 1-based line of instance ``index`` in a DOTA annfile.

    Instances reach the model in annfile order, minus the ``difficulty``-
    ignored ones (``PackDetInputs`` moves those to ``ignored_instances``).
    The line is returned only when the annfile holds exactly
    ``num_instances`` such instances, i.e. no transform dropped any.

    Args:
        annfile (str): The ``.txt`` annfile.
        index (int): Instance index in ``gt_instances``.
        num_instances (int): ``len(gt_instances)``.
        classes: Class names; by default every class in the file is
            accepted (the line order is all that matters here).

    Returns:
        int | None: The line, or None when it cannot be told.
    """
    with open(annfile) as f:
        names = [ln.split()[8] for ln in f if len(ln.split()) >= 10]
    classes = classes or sorted(set(names))
    instances, _ = parse_dota_annfile(annfile, classes, diff_thr=100)
    kept = [i['line'] for i in instances if not i['ignore_flag']]
    if len(kept) != num_instances or not 0 <= index < len(kept):
        return None
    return kept[index]


def _finding(
    sample: int, source: Dict[str, Any], violation, stage: str
) -> Dict[str, Any]:
    found = violation.to_dict()
    found.update(sample=sample, stage=stage, **source)
    return found


def check_batch(
    data_batch: Any,
    preprocessed: Optional[Any] = None,
    num_classes: Optional[int] = None,
    ignore_index: int = 255,
    ann_file: Optional[str] = None,
) -> List[Dict[str, Any]]:
    """Every data problem in a batch, per sample.

    Checks the raw ``inputs`` (floating images only: integer pixels are
    finite), the preprocessed ``inputs`` (normalisation can make inf), the
    ground-truth boxes (finite; width and height > 0, horizontal or
    rotated), their labels and an image classifier's ``gt_label``
    (``[0, num_classes)``) and ``gt_sem_seg`` (``[0, num_classes)`` or
    ``ignore_index``), in either batch layout
    (:func:`~mmnanguard.engine.incident.batch_layout.sample_records`: a
    list of data samples, or mmyolo's ``bboxes_labels``).

    Args:
        data_batch (dict): ``inputs`` and ``data_samples`` as the dataloader
            yields them (``batch.pth``'s ``data_batch``).
        preprocessed (dict, optional): The data preprocessor's output.
        num_classes (int, optional): Label range; None skips label and
            segmentation checks.
        ignore_index (int): Allowed extra segmentation value.
        ann_file (str, optional): The dataset's annotation file; a COCO
            json names each bad box's annotation id.

    Returns:
        list[dict]: One finding per violation: ``check``, ``index``
        (instance), ``values``, ``detail``, ``sample`` (index in the batch),
        ``stage`` (``'raw'``, ``'preprocessed'``, ``'gt_instances'``,
        ``'gt_label'`` or ``'gt_sem_seg'``), ``img_path``, ``img_id``,
        ``seg_map_path`` and the record: ``annfile`` and, for DOTA,
        ``line``; for VOC, ``object`` (in the xml); for COCO, ``ann_id``
        (in the json).
    """
    findings: List[Dict[str, Any]] = []
    records = sample_records(preprocessed) if preprocessed else []
    if not records:
        records = sample_records(data_batch)
    # the raw batch keeps the file names where the preprocessed one may
    # not (mmyolo's data preprocessor rebuilds ``img_metas``)
    raw_sources = sample_sources(data_batch)
    sources = [_source(records, raw_sources, i) for i in range(len(records))]
    stages = [('raw', (data_batch or {}).get('inputs'))]
    if preprocessed is not None:
        stages.append(('preprocessed', preprocessed.get('inputs')))
    for stage, inputs in stages:
        for i, img in enumerate(inputs if inputs is not None else []):
            if isinstance(img, torch.Tensor) and img.is_floating_point():
                for v in check_image(img.detach().float().cpu().numpy()):
                    src = sources[i] if i < len(sources) else {}
                    findings.append(_finding(i, src, v, stage))
        if findings:
            break  # a raw NaN pixel stays NaN after normalisation
    for i, record in enumerate(records):
        findings += _check_record(
            i, record, sources[i], num_classes, ignore_index, ann_file
        )
    return findings


def _source(
    records: List[Dict[str, Any]],
    raw_sources: List[Dict[str, Any]],
    i: int,
) -> Dict[str, Any]:
    source = {key: records[i].get(key) for key in SOURCE_KEYS}
    if i < len(raw_sources) and not any(source.values()):
        source = dict(raw_sources[i])
    return source


def _is_index_tensor(labels: Any) -> bool:
    """Class indices (integers), not one-hot or mixed scores."""
    if isinstance(labels, torch.Tensor):
        return not labels.is_floating_point() and labels.dim() <= 1
    dtype = getattr(labels, 'dtype', None)
    return getattr(dtype, 'kind', '') in ('i', 'u')


def clipped_side(box: Any, img_shape: Any) -> Optional[str]:
    """The border of the image a zero-size horizontal box sits on
    (``'left'``, ``'right'``, ``'top'``, ``'bottom'``): a box annotated
    outside the image, which the pipeline clipped to it; None otherwise.

    Args:
        box: ``(x1, y1, x2, y2)`` after the pipeline.
        img_shape: ``(height, width)`` after the pipeline.
    """
    if img_shape is None or len(box) != 4 or len(img_shape) < 2:
        return None
    x1, y1, x2, y2 = (float(v) for v in box)
    height, width = float(img_shape[0]), float(img_shape[1])
    if x2 - x1 <= 0 and (x2 <= 0 or x1 >= width):
        return 'left' if x2 <= 0 else 'right'
    if y2 - y1 <= 0 and (y2 <= 0 or y1 >= height):
        return 'top' if y2 <= 0 else 'bottom'
    return None


def _coco_raw(coco: CocoRecord, ori_shape: Any) -> Dict[str, Any]:
    """The box as the json writes it (``[x, y, w, h]``) and, when the json
    declares another size for the image than the file has, that size
    (mmdet keeps a box by the declared size, clips it to the real one)."""
    out: Dict[str, Any] = dict(raw=coco.bbox, raw_form='x, y, w, h')
    declared = coco.declared_shape
    if declared is not None and ori_shape is not None and len(ori_shape) >= 2:
        real = (float(ori_shape[0]), float(ori_shape[1]))
        if real != declared:
            out['declared_shape'] = [int(declared[0]), int(declared[1])]
            out['ori_shape'] = [int(real[0]), int(real[1])]
    return out


def _check_record(
    i: int,
    record: Dict[str, Any],
    source: Dict[str, Any],
    num_classes: Optional[int],
    ignore_index: int,
    ann_file: Optional[str] = None,
) -> List[Dict[str, Any]]:
    out: List[Dict[str, Any]] = []
    boxes = record['boxes']
    if boxes is not None and len(boxes):
        violations = check_boxes(boxes, min_size=0.0)
        annfile = dota_annfile_of(source.get('img_path'))
        xml = None if annfile else voc_xml_of(source.get('img_path'))
        for v in violations:
            found = _finding(i, source, v, 'gt_instances')
            side = (
                clipped_side(v.values, record.get('img_shape'))
                if v.check == 'hbox_size'
                else None
            )
            if side is not None:
                found.update(
                    clipped_at=side,
                    img_shape=[int(x) for x in record['img_shape'][:2]],
                )
            if annfile is not None and v.index is not None:
                found.update(
                    annfile=annfile,
                    line=annfile_line(annfile, v.index, len(boxes)),
                )
            elif xml is not None:
                found.update(annfile=xml)
                if v.index is not None:
                    found['object'] = voc_object_index(
                        xml, v.index, len(boxes)
                    )
                if side is not None and found.get('object'):
                    found['raw'] = voc_object_box(xml, found['object'])
            elif ann_file and v.index is not None:
                coco = coco_annotation(
                    ann_file, source.get('img_id'), v.index, len(boxes)
                )
                if coco is not None:
                    found.update(annfile=ann_file, ann_id=coco.ann_id)
                    if side is not None:
                        found.update(_coco_raw(coco, record.get('ori_shape')))
            out.append(found)
    if num_classes is None:
        return out
    for stage, labels in (
        ('gt_instances', record['labels']),
        ('gt_label', record['class_labels']),
    ):
        if labels is not None and _is_index_tensor(labels):
            out += [
                _finding(i, source, v, stage)
                for v in check_labels(labels, num_classes)
            ]
    seg_data = record['seg_map']
    if seg_data is not None:
        seg_np = seg_data.detach().cpu().numpy()
        out += [
            _finding(i, source, v, 'gt_sem_seg')
            for v in check_seg_map(seg_np, num_classes, ignore_index)
        ]
    return out
