# Copyright (c) mmnanguard contributors. All rights reserved.
"""Read a training batch's samples whatever layout its collate function
gave it.

Two layouts reach a model's ``train_step``, told apart by the batch
itself (``data['data_samples']``):

* a list of data samples (mmengine's ``pseudo_collate``): mmdet's
  ``DetDataSample``, mmpose's ``PoseDataSample``, mmpretrain's
  ``DataSample``, mmseg's ``SegDataSample``. Each carries its metainfo
  (``img_path``, ``img_id``, ...), ``gt_instances`` (``bboxes``,
  ``labels``, ``keypoints``), mmpretrain's ``gt_label`` or mmseg's
  ``gt_sem_seg``;
* a dict of batch tensors (mmyolo's ``yolov5_collate``): ``bboxes_labels``
  of shape ``(N, 6)``, one row ``(image index, label, x1, y1, x2, y2)``
  per box of the whole batch, ``keypoints``/``keypoints_visible`` row for
  row with it, and ``img_metas``, a list of per-image dicts (the data
  preprocessor's, or the names :class:`KeepSampleNames` kept).

:func:`sample_records` turns either into one record per image (read on an
incident only: splitting the dict layout by image reads the device);
:func:`target_tensors` gives the ground-truth tensors of a batch without
reading anything, for the per-iteration finiteness check.
"""

import os.path as osp
from collections.abc import Mapping
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

#: The metainfo keys that name where an image comes from.
SOURCE_KEYS = ('img_path', 'img_id', 'seg_map_path')


def _field(obj: Any, name: str) -> Any:
    """``obj.name`` of a data element, or None (``InstanceData`` raises
    ``AttributeError`` for a missing field)."""
    if obj is None:
        return None
    return getattr(obj, name, None)


def _file_field(meta: Mapping) -> Optional[Tuple[str, str]]:
    """``(key, value)`` of the first metainfo string that names an
    existing file or folder, keys that say so (``*path*``, ``*file*``)
    first: where a toolbox's samples keep their source under another name
    than ``img_path`` (a video's ``filename``, a restorer's ``gt_path``)."""
    texts = [(k, v) for k, v in meta.items() if isinstance(v, str) and v]
    named = [kv for kv in texts if 'path' in kv[0] or 'file' in kv[0]]
    for key, value in named + [kv for kv in texts if kv not in named]:
        if osp.exists(value):
            return str(key), value
    return None


def _source(meta: Any) -> Dict[str, Any]:
    """The :data:`SOURCE_KEYS` of a sample's metainfo; without an
    ``img_path``, the file another field names (and ``path_field``, that
    field's name), else the dataset index (``sample_idx``, kept by
    :class:`~.sample_origin.KeepSampleOrigin`)."""
    meta = meta if isinstance(meta, Mapping) else {}
    record = {key: meta.get(key) for key in SOURCE_KEYS}
    if record['img_path'] is None:
        found = _file_field(meta)
        if found is not None:
            record['path_field'], record['img_path'] = found
        elif isinstance(meta.get('sample_idx'), int):
            record['sample_idx'] = meta['sample_idx']
    return record


def _image_count(data: Mapping, samples: Mapping) -> Optional[int]:
    inputs = data.get('inputs')
    if isinstance(inputs, torch.Tensor) and inputs.dim() == 4:
        return int(inputs.shape[0])
    if isinstance(inputs, (list, tuple)) and inputs:
        return len(inputs)
    metas = samples.get('img_metas')
    return len(metas) if isinstance(metas, (list, tuple)) else None


def _class_labels(sample: Any) -> Any:
    """A classifier's class labels: ``gt_label`` (mmpretrain, mmaction2
    1.2), or the tensor ``gt_labels.item`` (mmaction2 1.0 and 1.1)."""
    labels = _field(sample, 'gt_label')
    if labels is None:
        item = _field(_field(sample, 'gt_labels'), 'item')
        labels = item if isinstance(item, torch.Tensor) else None
    return labels


def _sample_record(sample: Any) -> Dict[str, Any]:
    """The record of one data sample of the list layout."""
    meta = getattr(sample, 'metainfo', None)
    record = _source(meta)
    instances = _field(sample, 'gt_instances')
    meta_of = meta if isinstance(meta, Mapping) else {}
    record.update(
        img_shape=meta_of.get('img_shape'),
        ori_shape=meta_of.get('ori_shape'),
        boxes=_field(instances, 'bboxes'),
        labels=_field(instances, 'labels'),
        keypoints=_field(instances, 'keypoints'),
        keypoints_visible=_field(instances, 'keypoints_visible'),
        class_labels=_class_labels(sample),
        seg_map=_field(_field(sample, 'gt_sem_seg'), 'data'),
    )
    return record


def _packed_records(data: Mapping, samples: Mapping) -> List[Dict[str, Any]]:
    """The records of the dict layout, split by the image index column."""
    rows = samples.get('bboxes_labels')
    count = _image_count(data, samples)
    if count is None and isinstance(rows, torch.Tensor) and len(rows):
        count = int(rows[:, 0].max().item()) + 1
    metas = samples.get('img_metas')
    metas = metas if isinstance(metas, (list, tuple)) else []
    keypoints = samples.get('keypoints')
    visible = samples.get('keypoints_visible')
    records = []
    for i in range(count or 0):
        meta = metas[i] if i < len(metas) else None
        record = _source(meta)
        meta_of = meta if isinstance(meta, Mapping) else {}
        record.update(
            img_shape=meta_of.get('img_shape'),
            ori_shape=meta_of.get('ori_shape'),
            boxes=None,
            labels=None,
            keypoints=None,
            keypoints_visible=None,
            class_labels=None,
            seg_map=None,
        )
        if isinstance(rows, torch.Tensor) and rows.dim() == 2:
            mine = rows[:, 0] == i
            record['boxes'] = rows[mine, 2:]
            record['labels'] = rows[mine, 1].round().long()
            if isinstance(keypoints, torch.Tensor):
                record['keypoints'] = keypoints[mine]
            if isinstance(visible, torch.Tensor):
                record['keypoints_visible'] = visible[mine]
        records.append(record)
    return records


def sample_records(data: Any) -> List[Dict[str, Any]]:
    """One record per image of a batch, from either layout.

    Args:
        data (dict): A batch, as the dataloader yields it or as the data
            preprocessor returns it (``inputs`` and ``data_samples``).

    Returns:
        list[dict]: Per image: ``img_path``, ``img_id``, ``seg_map_path``
        (None where the batch does not carry them; a sample without
        ``img_path`` gives the existing file another metainfo field names,
        and that field as ``path_field``), ``boxes`` (the
        ground-truth boxes: ``BaseBoxes``, a tensor or an array),
        ``labels`` (their class indices), ``keypoints``,
        ``keypoints_visible``, ``class_labels`` (an image classifier's
        ``gt_label``) and ``seg_map`` (``gt_sem_seg.data``), each None
        where absent. Empty for a batch of another form.
    """
    if not isinstance(data, Mapping):
        return []
    samples = data.get('data_samples')
    if isinstance(samples, Mapping):
        return _packed_records(data, samples)
    if isinstance(samples, (list, tuple)):
        return [_sample_record(sample) for sample in samples]
    return []


def sample_sources(data: Any) -> List[Dict[str, Any]]:
    """``img_path``, ``img_id`` and ``seg_map_path`` of every image of a
    batch (see :func:`sample_records`), ``path_field`` where the file
    came from another metainfo field than ``img_path``, and
    ``sample_idx`` where no field names a file."""
    return [
        {
            key: record[key]
            for key in SOURCE_KEYS + ('path_field', 'sample_idx')
            if key in record
        }
        for record in sample_records(data)
    ]


def sample_name(source: Mapping) -> str:
    """The name that tells a sample apart: its ``img_path``, else its
    ``seg_map_path``, else its ``img_id`` (a source of
    :func:`sample_sources`)."""
    return str(
        source.get('img_path')
        or source.get('seg_map_path')
        or source.get('img_id')
    )


def target_tensors(data: Any) -> List[Any]:
    """The ground-truth box tensors of a batch, read from nothing but the
    Python structure (no device read).

    Args:
        data (dict): A preprocessed batch.

    Returns:
        list: ``gt_instances.bboxes`` of every data sample (the list
        layout), or ``bboxes_labels`` and ``keypoints`` (the dict layout).
    """
    if not isinstance(data, Mapping):
        return []
    samples = data.get('data_samples')
    if isinstance(samples, Mapping):
        return [
            samples[key]
            for key in ('bboxes_labels', 'keypoints')
            if isinstance(samples.get(key), torch.Tensor)
        ]
    out = []
    for sample in samples if isinstance(samples, (list, tuple)) else []:
        boxes = _field(_field(sample, 'gt_instances'), 'bboxes')
        if boxes is not None:
            out.append(boxes)
    return out


def _names_of(item: Any) -> Dict[str, Any]:
    sample = item.get('data_samples') if isinstance(item, Mapping) else None
    meta = getattr(sample, 'metainfo', None) or {}
    return {
        key: meta[key]
        for key in SOURCE_KEYS
        if isinstance(meta.get(key), (str, int))
    }


class KeepSampleNames:
    """Wrap a collate function so that a batch of the dict layout keeps
    the file names of its images.

    ``yolov5_collate`` keeps the boxes of every sample but drops their
    metainfo. Where the collated ``data_samples`` is a dict without
    ``img_metas``, this adds ``img_metas``: per image, the ``img_path``,
    ``img_id`` and ``seg_map_path`` of its data sample (strings and
    integers only). mmyolo's data preprocessor builds its own
    ``img_metas`` for the model, so the model sees the same batch. Any
    other batch is returned as the collate function made it.

    Args:
        collate_fn (Callable): The dataloader's collate function.
    """

    def __init__(self, collate_fn: Callable[[Sequence[Any]], Any]) -> None:
        self.collate_fn = collate_fn

    def __call__(self, data_batch: Sequence[Any]) -> Any:
        out = self.collate_fn(data_batch)
        samples = out.get('data_samples') if isinstance(out, dict) else None
        if isinstance(samples, dict) and 'img_metas' not in samples:
            samples['img_metas'] = [_names_of(item) for item in data_batch]
        return out


def keep_sample_names(loader: Any) -> Any:
    """Wrap ``loader.collate_fn`` in :class:`KeepSampleNames` (once).

    Args:
        loader (DataLoader): A built dataloader (anything without a
            ``collate_fn`` is returned unchanged).

    Returns:
        The same loader.
    """
    collate_fn = getattr(loader, 'collate_fn', None)
    if callable(collate_fn) and not isinstance(collate_fn, KeepSampleNames):
        loader.collate_fn = KeepSampleNames(collate_fn)
    return loader


__all__ = [
    'KeepSampleNames',
    'SOURCE_KEYS',
    'keep_sample_names',
    'sample_name',
    'sample_records',
    'sample_sources',
    'target_tensors',
]
