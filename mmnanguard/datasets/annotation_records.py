# Copyright (c) mmnanguard contributors. All rights reserved.
"""Name the record behind an instance: the annotation id in a COCO json
(with its box as written and the image size the json declares), the
object in a VOC xml.

An instance reaches the model by its index in ``gt_instances``; the user
fixes the record in the annotation file. Both readers follow the order
and the filters of mmdet's own parsers (``CocoDataset.parse_data_info``,
``XMLDataset._parse_instance_info``) and answer only when the count of
records they keep equals the count of instances the model received (no
transform dropped or added one): otherwise None, never a guess.
"""

import json
import os
import os.path as osp
import xml.etree.ElementTree as ET
from functools import lru_cache
from numbers import Real
from typing import Any, Dict, List, NamedTuple, Optional, Tuple, cast

#: Largest annotation json read to name a record. The diagnosis runs in
#: the training process: a json takes several times its size in memory
#: once parsed, so a larger one (COCO train2017's 448 MB) is not read and
#: the image alone is named.
MAX_JSON_BYTES = 256 << 20

#: ``(annotation id, iscrowd, bbox)`` of the records mmdet keeps of one
#: image, in file order.
_Kept = List[Tuple[Any, bool, List[float]]]


class CocoRecord(NamedTuple):
    """One annotation of a COCO json, as written.

    Attributes:
        ann_id: Its ``id``.
        bbox (list[float]): Its ``bbox``, ``[x, y, w, h]``.
        declared_shape (tuple | None): ``(height, width)`` of its image as
            the json's ``images`` entry declares it (mmdet's filter of
            boxes outside the image uses these), None when not numbers.
    """

    ann_id: Any
    bbox: List[float]
    declared_shape: Optional[Tuple[float, float]]


def _number(value: Any) -> Optional[float]:
    if isinstance(value, Real) and not isinstance(value, bool):
        return float(value)
    return None


def _kept_as_crowd(ann: Any, width: Any, height: Any) -> Optional[bool]:
    """Whether mmdet keeps ``ann`` as an ignored (``iscrowd``) instance:
    False for a ground-truth one, None when it drops the record."""
    if not isinstance(ann, dict) or ann.get('ignore', False):
        return None
    bbox = ann.get('bbox')
    if not isinstance(bbox, list) or len(bbox) != 4:
        return None
    numbers = [_number(v) for v in bbox + [ann.get('area')]]
    if any(v is None for v in numbers):
        return None
    x1, y1, w, h, area = cast(List[float], numbers)
    img_w, img_h = _number(width), _number(height)
    if img_w is not None and img_h is not None:
        inter_w = max(0.0, min(x1 + w, img_w) - max(x1, 0.0))
        inter_h = max(0.0, min(y1 + h, img_h) - max(y1, 0.0))
        if inter_w * inter_h == 0:  # outside the image
            return None
    if area <= 0 or w < 1 or h < 1:
        return None
    return bool(ann.get('iscrowd', False))


@lru_cache(maxsize=2)
def _coco_index(
    path: str, mtime_ns: int, size: int
) -> Dict[Any, Tuple[Any, Any, _Kept]]:
    """image id -> ``(width, height, kept records)`` of one json (cached
    by path, modification time and size)."""
    with open(path, encoding='utf-8') as f:
        coco = json.load(f)
    if not isinstance(coco, dict):
        return {}
    images = coco.get('images')
    anns = coco.get('annotations')
    index: Dict[Any, Tuple[Any, Any, _Kept]] = {}
    for img in images if isinstance(images, list) else []:
        img_id = img.get('id') if isinstance(img, dict) else None
        if isinstance(img_id, (int, str)):
            index[img_id] = (img.get('width'), img.get('height'), [])
    for ann in anns if isinstance(anns, list) else []:
        img_id = ann.get('image_id') if isinstance(ann, dict) else None
        if not isinstance(img_id, (int, str)) or img_id not in index:
            continue
        width, height, kept = index[img_id]
        crowd = _kept_as_crowd(ann, width, height)
        if crowd is not None:
            bbox = [float(v) for v in ann['bbox']]
            kept.append((ann.get('id'), crowd, bbox))
    return index


def coco_annotation(
    ann_file: str,
    img_id: Any,
    index: int,
    num_instances: int,
    with_ignored: bool = False,
) -> Optional[CocoRecord]:
    """The record of instance ``index`` of image ``img_id`` in a COCO
    json.

    mmdet keeps an image's annotations in file order, without the ones it
    drops (``ignore``, a box outside the image, area <= 0, a side < 1, a
    category outside the classes) and without the ``iscrowd`` ones, which
    ``PackDetInputs`` moves to ``ignored_instances``. Every category of the
    file is taken as a class.

    Args:
        ann_file (str): The dataset's annotation json.
        img_id: The sample's ``img_id``.
        index (int): Instance index in ``gt_instances``.
        num_instances (int): ``len(gt_instances)``.
        with_ignored (bool): Count the ``iscrowd`` records too (the
            instances as ``LoadAnnotations`` loads them, before
            ``PackDetInputs``). Defaults to False.

    Returns:
        CocoRecord | None: The annotation, or None when the file is not a
        ``.json`` (or is a link), cannot be read, is not a COCO json, or
        keeps another number of records for the image.
    """
    if not isinstance(ann_file, str) or not ann_file.endswith('.json'):
        return None
    try:
        if osp.islink(ann_file) or not osp.isfile(ann_file):
            return None
        stat = os.stat(ann_file)
        if stat.st_size > MAX_JSON_BYTES:
            return None
        index_of = _coco_index(ann_file, stat.st_mtime_ns, stat.st_size)
    except (OSError, ValueError, RecursionError):
        return None
    entry = index_of.get(img_id) if isinstance(img_id, (int, str)) else None
    if entry is None:
        return None
    kept = [r for r in entry[2] if with_ignored or not r[1]]
    if len(kept) != num_instances or not 0 <= index < len(kept):
        return None
    ann_id, _, bbox = kept[index]
    width, height = _number(entry[0]), _number(entry[1])
    declared = None if width is None or height is None else (height, width)
    return CocoRecord(ann_id, bbox, declared)


def coco_annotation_id(
    ann_file: str,
    img_id: Any,
    index: int,
    num_instances: int,
    with_ignored: bool = False,
) -> Optional[Any]:
    """The ``id`` of :func:`coco_annotation`'s record (same arguments), or
    None."""
    record = coco_annotation(
        ann_file, img_id, index, num_instances, with_ignored
    )
    return None if record is None else record.ann_id


def voc_object_box(xml_file: str, position: int) -> Optional[List[float]]:
    """The ``bndbox`` of the 1-based ``<object>`` ``position`` of a VOC
    xml, as written (``[xmin, ymin, xmax, ymax]``), or None when the file,
    the object or a coordinate cannot be read."""
    try:
        objects = ET.parse(xml_file).getroot().findall('object')
    except (OSError, ET.ParseError):
        return None
    if not 1 <= position <= len(objects):
        return None
    box = objects[position - 1].find('bndbox')
    if box is None:
        return None
    values = []
    for key in ('xmin', 'ymin', 'xmax', 'ymax'):
        try:  # mmdet reads them as float(text)
            values.append(float(box.findtext(key) or ''))
        except ValueError:
            return None
    return values


def voc_object_index(
    xml_file: str, index: int, num_instances: int, with_ignored: bool = False
) -> Optional[int]:
    """The 1-based ``<object>`` of instance ``index`` in a VOC xml.

    mmdet keeps the objects in file order and moves the ``difficult`` ones
    to ``ignored_instances``; every class name of the file is taken as a
    class.

    Args:
        xml_file (str): The image's xml.
        index (int): Instance index in ``gt_instances``.
        num_instances (int): ``len(gt_instances)``.
        with_ignored (bool): Count the ``difficult`` objects too (the
            instances as loaded). Defaults to False.

    Returns:
        int | None: The object's position among the file's ``<object>``
        elements, or None when it cannot be told.
    """
    try:
        objects = ET.parse(xml_file).getroot().findall('object')
    except (OSError, ET.ParseError):
        return None
    kept = []
    for position, obj in enumerate(objects, start=1):
        difficult = obj.find('difficult')
        text = '' if difficult is None else (difficult.text or '').strip()
        if with_ignored or text != '1':
            kept.append(position)
    if len(kept) != num_instances or not 0 <= index < len(kept):
        return None
    return kept[index]


def annotation_file_of(dataset: Any) -> Optional[str]:
    """The annotation file of a built dataset (through ``RepeatDataset``
    and the like, which hold one ``dataset``), when it is a file.

    Args:
        dataset: A built dataset (``runner.train_dataloader.dataset``).

    Returns:
        str | None: ``dataset.ann_file`` (joined with ``data_root`` by the
        dataset), or None for a folder of annfiles, a concatenation or a
        dataset without one.
    """
    for _ in range(8):  # wrappers of wrappers, never a cycle
        inner = getattr(dataset, 'dataset', None)
        if inner is None or inner is dataset:
            break
        dataset = inner
    ann_file = getattr(dataset, 'ann_file', None)
    if isinstance(ann_file, str) and ann_file and osp.isfile(ann_file):
        return ann_file
    return None
