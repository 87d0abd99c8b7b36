# Copyright (c) mmnanguard contributors. All rights reserved.
"""Keep where each training sample came from in its data sample.

A toolbox's packing transform keeps the metainfo keys it was told to keep:
mmdet's ``PackDetInputs`` keeps ``img_path``, but mmaction2's
``PackActionInputs`` keeps none that names the file (a video's
``filename``, a folder of frames' ``frame_dir``), and the dataset index of
the sample is kept by none. An incident report of such a batch could not
say which files it held.

:class:`KeepSampleOrigin` wraps a dataset's pipeline: it reads, from the
data info that goes in, the dataset index (``sample_idx``, which
mmengine's ``BaseDataset.get_data_info`` sets) and every string field
whose key says it names a file or folder, and adds those the packed data
sample does not carry to its metainfo. What the model computes is
unchanged: only metainfo keys the sample lacked are added, and the batch's
tensors are the pipeline's own.
"""

from typing import Any, Dict, List, Optional

from mmnanguard.datasets.scan_leaves import inner_datasets

#: Last words of a data info key (split at ``_``) that say its value names
#: a file or folder: ``img_path``, ``seg_map_path``, ``filename``,
#: ``frame_dir``, ``gt_path``, ``file_name``. A key that only contains such
#: a word (``flip_direction``) does not.
FILE_KEY_ENDS = ('path', 'file', 'filename', 'dir', 'folder', 'file_name')


def _names_a_file(key: str) -> bool:
    words = key.lower().split('_')
    return words[-1] in FILE_KEY_ENDS or '_'.join(words[-2:]) in FILE_KEY_ENDS


def origin_fields(info: Any) -> Dict[str, Any]:
    """The fields of a data info that tell where its sample came from.

    Args:
        info (dict): A data info, as a dataset's pipeline receives it.

    Returns:
        dict: ``sample_idx`` (where an int) and the non-empty string fields
        whose key ends with one of :data:`FILE_KEY_ENDS`.
    """
    if not isinstance(info, dict):
        return {}
    found: Dict[str, Any] = {
        key: value
        for key, value in info.items()
        if isinstance(key, str)
        and isinstance(value, str)
        and value
        and _names_a_file(key)
    }
    idx = info.get('sample_idx')
    if isinstance(idx, int) and not isinstance(idx, bool):
        found['sample_idx'] = idx
    return found


class KeepSampleOrigin:
    """A dataset pipeline that adds its sample's origin to the metainfo of
    the packed data sample (see the module docstring).

    Args:
        pipeline (Callable): The dataset's pipeline (a ``Compose``).
    """

    def __init__(self, pipeline: Any) -> None:
        self.pipeline = pipeline

    @property
    def transforms(self) -> List[Any]:
        """The wrapped pipeline's transforms."""
        return list(getattr(self.pipeline, 'transforms', []))

    def __call__(self, info: Any) -> Any:
        origin = origin_fields(info)
        out = self.pipeline(info)
        sample = out.get('data_samples') if isinstance(out, dict) else None
        metainfo = getattr(sample, 'metainfo', None)
        if origin and sample is not None and isinstance(metainfo, dict):
            missing = {k: v for k, v in origin.items() if k not in metainfo}
            if missing:
                sample.set_metainfo(missing)
        return out

    def __repr__(self) -> str:
        return f'{type(self).__name__}({self.pipeline!r})'


def _loading_datasets(dataset: Any) -> List[Any]:
    """The datasets under ``dataset`` that load samples with a pipeline of
    their own, through the wrappers
    (:func:`~mmnanguard.datasets.scan_leaves.inner_datasets`)."""
    if dataset is None:
        return []
    inner = inner_datasets(dataset)
    if inner is None:
        return (
            [dataset] if callable(getattr(dataset, 'pipeline', None)) else []
        )
    return [leaf for child in inner for leaf in _loading_datasets(child)]


def keep_sample_origin(loader: Any) -> Optional[Any]:
    """Wrap the pipeline of every dataset under ``loader.dataset`` in
    :class:`KeepSampleOrigin` (once).

    Args:
        loader (DataLoader): A built dataloader; anything without a
            ``dataset`` is returned unchanged.

    Returns:
        The same loader.
    """
    for dataset in _loading_datasets(getattr(loader, 'dataset', None)):
        if not isinstance(dataset.pipeline, KeepSampleOrigin):
            dataset.pipeline = KeepSampleOrigin(dataset.pipeline)
    return loader


__all__ = ['KeepSampleOrigin', 'keep_sample_origin', 'origin_fields']
