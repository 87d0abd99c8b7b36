# Copyright (c) mmnanguard contributors. All rights reserved.
"""Point any upstream training config at a generated data set.

The data set of the right kind is generated (``mmnanguard.datagen``): DOTA
for mmrotate, COCO for mmdet (its polygons give instance segmentation
configs their masks), Cityscapes for mmseg. The config's
training data set (the innermost one, inside ``RepeatDataset``,
``ClassBalancedDataset``, ``MultiImageMixDataset``; the first of a
``ConcatDataset``) is switched to that format and keeps its pipeline. The
annotated classes are the first ``k`` of the generated set, ``k`` at most
the model's smallest ``num_classes``, so that every label is one the model
can take; for COCO and DOTA the data set's class list is padded with
unannotated names to the model's ``num_classes`` (mmdet's
``NumClassCheckHook`` compares the two). The model is not changed.

A benchmark helper, not part of the package: the zoo sweep
(``benchmarks/zoo_cell.py``, ``benchmarks/zoo_static.py``) imports it as
a sibling module (``benchmarks/`` is on ``sys.path`` as the running
script's folder); ``mmnanguard.testing.shrink`` shrinks the model and the
runtime.
"""

import os.path as osp
from typing import Any, Callable, Dict, List, Optional, Tuple

from mmnanguard.datagen import (
    CITYSCAPES_NUM_CLASSES,
    COCO_TINY_CLASSES,
    DOTA_CLASSES,
    generate_cityscapes,
    generate_coco,
    generate_dota,
)

#: Package -> the generated data kind it trains on.
PACKAGE_DATA = dict(mmdet='coco', mmrotate='dota', mmseg='cityscapes')
#: Data kind -> number of classes the generator can produce.
KIND_CLASSES = dict(
    coco=len(COCO_TINY_CLASSES),
    dota=len(DOTA_CLASSES),
    cityscapes=CITYSCAPES_NUM_CLASSES,
)
#: Side of the generated images (Cityscapes: width; height is half).
IMG_SIDE = 256
#: Transforms whose data the generators cannot produce -> what they need.
UNSUPPORTED_TRANSFORMS = {
    'LoadPanopticAnnotations': 'panoptic segmentation maps',
    'LoadTrackAnnotations': 'video with tracking annotations',
    'MultiBranch': 'unlabeled images in a semi-supervised split',
    'LoadProposals': 'precomputed proposals',
    'LoadMultiChannelImageFromFiles': 'multi-channel image stacks',
    'PackTrackInputs': 'video with tracking annotations',
    'PackReIDInputs': 'person re-identification crops',
    'LoadMultipleRSImageFromFile': 'image pairs for change detection',
    'LoadDepthAnnotation': 'depth maps',
}


def model_num_classes(model: Any) -> Optional[int]:
    """The smallest positive ``num_classes`` in a model config (an RPN
    head's excluded), or None when no entry has one."""
    found: List[int] = []

    def walk(cfg: Any, key: str = '') -> None:
        if key == 'rpn_head':
            return
        if isinstance(cfg, dict):
            value = cfg.get('num_classes')
            if isinstance(value, int) and value > 0:
                found.append(value)
            for k, v in cfg.items():
                walk(v, k)
        elif isinstance(cfg, (list, tuple)):
            for v in cfg:
                walk(v, key)

    walk(model)
    return min(found) if found else None


def dataset_pipelines(dataset: Any) -> List[list]:
    """Every ``pipeline`` list in a (possibly wrapped) data set config."""
    if not isinstance(dataset, dict):
        return []
    found = (
        [dataset['pipeline']]
        if isinstance(dataset.get('pipeline'), list)
        else []
    )
    found += dataset_pipelines(dataset.get('dataset'))
    for inner in dataset.get('datasets') or []:
        found += dataset_pipelines(inner)
    return found


def _transforms(pipeline: Any) -> List[Dict[str, Any]]:
    """Every transform config in a pipeline, nested ones included."""
    found: List[Dict[str, Any]] = []
    if isinstance(pipeline, dict):
        if 'type' in pipeline:
            found.append(pipeline)
        for value in pipeline.values():
            found += _transforms(value)
    elif isinstance(pipeline, (list, tuple)):
        for value in pipeline:
            found += _transforms(value)
    return found


def unsupported_data(dataset: Any) -> Optional[str]:
    """What a training data set config needs that cannot be generated.

    Args:
        dataset (dict): ``train_dataloader.dataset``.

    Returns:
        str or None: The data it needs (e.g. ``'panoptic segmentation
        maps'``), or None when the generated set will do.
    """
    for transform in _transforms(dataset_pipelines(dataset)):
        name = str(transform.get('type', '')).rpartition('.')[2]
        if name in UNSUPPORTED_TRANSFORMS:
            return f'{UNSUPPORTED_TRANSFORMS[name]} ({name})'
        if name == 'LoadAnnotations' and transform.get('with_seg'):
            return 'semantic segmentation maps of a detection set (with_seg)'
    return None


def _replace_leaf(
    dataset: Dict[str, Any], make_leaf: Callable[[Dict], Dict]
) -> Tuple[Dict[str, Any], List[str]]:
    if isinstance(dataset.get('datasets'), list) and dataset['datasets']:
        first, notes = _replace_leaf(dataset['datasets'][0], make_leaf)
        return first, [
            f"{dataset.get('type')} of {len(dataset['datasets'])} "
            'data sets: the first kept'
        ] + notes
    if isinstance(dataset.get('dataset'), dict):
        inner, notes = _replace_leaf(dataset['dataset'], make_leaf)
        dataset['dataset'] = inner
        return dataset, notes
    new = make_leaf(dataset)
    return new, [f"train dataset {dataset.get('type')} -> {new['type']}"]


def _leaf_config(
    kind: str, data_root: str, classes: Tuple[str, ...], old: Dict
) -> Dict[str, Any]:
    base = dict(
        data_root=osp.join(data_root, ''), pipeline=old.get('pipeline', [])
    )
    if kind == 'coco':
        return dict(
            base,
            type='mmdet.CocoDataset',
            ann_file='annotations/instances.json',
            data_prefix=dict(img='images/'),
            metainfo=dict(classes=classes),
            filter_cfg=old.get('filter_cfg') or dict(filter_empty_gt=True),
            backend_args=None,
        )
    if kind == 'dota':
        return dict(
            base,
            type='mmrotate.DOTADataset',
            ann_file='trainval/annfiles/',
            data_prefix=dict(img_path='trainval/images/'),
            metainfo=dict(classes=classes),
            filter_cfg=dict(filter_empty_gt=True),
        )
    # mmseg refuses a data set whose reduce_zero_label differs from its
    # LoadAnnotations' (ADE20K sets it in both)
    loads = [
        t
        for t in _transforms(base['pipeline'])
        if str(t.get('type')).endswith('LoadAnnotations')
        and 'reduce_zero_label' in t
    ]
    out = dict(
        base,
        type='mmseg.CityscapesDataset',
        data_prefix=dict(
            img_path='leftImg8bit/train', seg_map_path='gtFine/train'
        ),
        reduce_zero_label=bool(
            loads[0]['reduce_zero_label']
            if loads
            else old.get('reduce_zero_label', False)
        ),
    )
    if len(classes) < CITYSCAPES_NUM_CLASSES:
        # a subset: mmseg maps the other train ids to 255 (ignored)
        out['metainfo'] = dict(classes=classes)
    return out


def class_names(kind: str, num_classes: Optional[int]) -> Tuple[str, ...]:
    """The first ``num_classes`` class names of a generated data kind."""
    if kind == 'coco':
        names = COCO_TINY_CLASSES
    elif kind == 'dota':
        names = DOTA_CLASSES
    else:
        from mmseg.datasets import CityscapesDataset

        names = tuple(CityscapesDataset.METAINFO['classes'])
    k = len(names) if num_classes is None else min(num_classes, len(names))
    return tuple(names[:k])


def switch_dataset(
    cfg: Any, kind: str, data_root: str, num_classes: Optional[int]
) -> List[str]:
    """Point ``cfg.train_dataloader`` at a generated data set, in place.

    Args:
        cfg (Config): The whole config.
        kind (str): ``'coco'``, ``'dota'`` or ``'cityscapes'``.
        data_root (str): Where :func:`generate_data` wrote that kind.
        num_classes (int, optional): The model's smallest class count.

    Returns:
        list[str]: What was changed.

    Raises:
        ValueError: For an unknown ``kind``.
    """
    if kind not in KIND_CLASSES:
        raise ValueError(
            f'data kind {kind!r} is invalid; expected one of '
            f'{tuple(KIND_CLASSES)}'
        )
    classes = class_names(kind, num_classes)
    metainfo = classes
    if kind != 'cityscapes' and num_classes and num_classes > len(classes):
        # as many names as the model has classes (mmdet's
        # NumClassCheckHook compares the two); the extra ones have no
        # annotation in the generated files
        metainfo += tuple(
            f'unused_{i}' for i in range(len(classes), num_classes)
        )
    loader = cfg.train_dataloader
    dataset, notes = _replace_leaf(
        loader['dataset'],
        lambda old: _leaf_config(kind, data_root, metainfo, old),
    )
    loader['dataset'] = dataset
    return notes + [
        f'{len(classes)} annotated classes {classes} of {len(metainfo)}'
    ]


def generate_data(
    kind: str, root: str, num_classes: Optional[int], num_images: int = 8
) -> str:
    """Generate a tiny data set of ``kind`` under ``root``.

    Args:
        kind (str): ``'coco'``, ``'dota'`` or ``'cityscapes'``.
        root (str): Output folder.
        num_classes (int, optional): DOTA draws only the first
            ``num_classes`` classes (its loader refuses other names); COCO
            and Cityscapes write all and the data set config selects.
        num_images (int): Number of images. Defaults to 8.

    Returns:
        str: ``root``.

    Raises:
        ValueError: For an unknown ``kind``.
    """
    if kind == 'coco':
        # with a polygon per object: instance masks for Mask R-CNN & co.
        generate_coco(root, num_images=num_images, img_size=IMG_SIDE)
    elif kind == 'dota':
        generate_dota(
            root,
            num_images=num_images,
            img_size=IMG_SIDE,
            classes=class_names(kind, num_classes),
        )
    elif kind == 'cityscapes':
        generate_cityscapes(
            root, num_images=num_images, img_size=(IMG_SIDE, IMG_SIDE // 2)
        )
    else:
        raise ValueError(
            f'data kind {kind!r} is invalid; expected one of '
            f'{tuple(KIND_CLASSES)}'
        )
    return root
