# Copyright (c) mmnanguard contributors. All rights reserved.
"""The datasets a scan reads, through the wrappers a config puts around
them.

A config's dataset is often a wrapper: mmengine's ``ConcatDataset``
(mmocr's recognizers, mmdet's VOC 2007 + 2012), ``RepeatDataset`` and
``ClassBalancedDataset``, mmdet's ``MultiImageMixDataset`` (mosaic). A
wrapper loads nothing itself: :func:`scan_leaves` finds the datasets that
do (each with its own pipeline, classes and annotation file), by what the
built objects hold (``datasets``, or one ``dataset``), and says what a
wrapper adds that a one-sample scan does not run (a mixing pipeline).
"""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from .annotation_records import annotation_file_of


def split_pipeline(transforms: List[Any]) -> Tuple[List[Any], List[Any]]:
    """Split a built pipeline into loading and augmentation transforms.

    Args:
        transforms (list): ``dataset.pipeline.transforms``.

    Returns:
        tuple: ``(loading, augment)``: the leading loading transforms, and
        the rest without ``Pack*`` and ``ValidateAnnotations``.
    """
    loading = []
    for transform in transforms:
        if not is_loading_transform(transform):
            break
        loading.append(transform)
    augment = [
        t
        for t in transforms[len(loading) :]
        if not type(t).__name__.startswith('Pack')
        and type(t).__name__ != 'ValidateAnnotations'
    ]
    return loading, augment


#: Class names of the transforms that make up the loading stage.
LOADING_TRANSFORMS = ('ConvertBoxType', 'ConvertMask2BoxType')


def is_loading_transform(transform: Any) -> bool:
    """Whether ``transform`` belongs to the loading stage."""
    name = type(transform).__name__
    return name.startswith('Load') or name in LOADING_TRANSFORMS


@dataclass
class ScanLeaf:
    """One dataset that loads samples, as a scan reads it.

    Attributes:
        dataset: The built dataset.
        offset (int): Index of its first sample among all the scan's.
        loading (list): Its loading transforms.
        augment (list): The rest of its pipeline, without ``Pack*`` and
            ``ValidateAnnotations``.
        packing (list): Its ``Pack*`` transforms.
        num_classes (int | None): ``len(metainfo['classes'])``.
        ann_file (str | None): Its annotation file.
    """

    dataset: Any
    offset: int
    loading: List[Any] = field(default_factory=list)
    augment: List[Any] = field(default_factory=list)
    packing: List[Any] = field(default_factory=list)
    num_classes: Optional[int] = None
    ann_file: Optional[str] = None

    @classmethod
    def of(cls, dataset: Any, offset: int) -> 'ScanLeaf':
        """The leaf of a dataset that has a pipeline."""
        transforms = list(getattr(dataset.pipeline, 'transforms', []))
        loading, augment = split_pipeline(transforms)
        classes = (getattr(dataset, 'metainfo', None) or {}).get('classes')
        return cls(
            dataset=dataset,
            offset=offset,
            loading=loading,
            augment=augment,
            packing=[
                t for t in transforms if type(t).__name__.startswith('Pack')
            ],
            num_classes=len(classes) if classes else None,
            ann_file=annotation_file_of(dataset),
        )


def inner_datasets(dataset: Any) -> Optional[List[Any]]:
    """The datasets a wrapper holds, or None for a dataset that loads."""
    if hasattr(dataset, 'pipeline') and not hasattr(dataset, 'dataset'):
        return None
    many = getattr(dataset, 'datasets', None)
    if isinstance(many, (list, tuple)) and many:
        return list(many)
    one = getattr(dataset, 'dataset', None)
    if one is not None and hasattr(one, 'get_data_info'):
        return [one]
    return None


def scan_leaves(dataset: Any) -> Tuple[List[ScanLeaf], List[str]]:
    """The datasets under ``dataset`` that load samples, in index order
    (each once: a repeat adds no other sample), and what the wrappers add
    that is not scanned.

    Args:
        dataset: A built dataset, wrapped or not.

    Returns:
        tuple: ``(leaves, not_scanned)``.
    """
    leaves: List[ScanLeaf] = []
    notes: List[str] = []
    offset = 0

    def walk(node: Any) -> None:
        nonlocal offset
        inner = inner_datasets(node)
        if inner is None:
            leaves.append(ScanLeaf.of(node, offset))
            offset += len(node)
            return
        own = getattr(node, 'pipeline', None)
        if own:
            names = ', '.join(
                type(t).__name__ for t in getattr(own, 'transforms', own)
            )
            notes.append(
                f"{type(node).__name__}'s own pipeline ({names}): it mixes "
                'several samples; the scan checks each sample alone'
            )
        for child in inner:
            walk(child)

    walk(dataset)
    return leaves, notes


def leaf_of(leaves: List[ScanLeaf], idx: int) -> Tuple[ScanLeaf, int]:
    """The leaf of scan index ``idx`` and the index inside it."""
    for leaf in reversed(leaves):
        if idx >= leaf.offset:
            return leaf, idx - leaf.offset
    raise IndexError(idx)


def describe_leaves(leaves: List[ScanLeaf]) -> Dict[str, Any]:
    """The leaves for the report: type and sample count of each."""
    return dict(
        datasets=[
            dict(type=type(leaf.dataset).__name__, samples=len(leaf.dataset))
            for leaf in leaves
        ]
    )
