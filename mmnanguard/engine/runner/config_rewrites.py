# Copyright (c) mmnanguard contributors. All rights reserved.
"""Config rewrites applied by :class:`NanGuardRunner` before it builds.

Both are drop-in: the model computes the same losses and the pipeline
yields the same samples, plus checks whose findings are logged or raised.
Each rewrite returns what it changed, so that the runner can log it.
"""

import copy
from typing import Any, Dict, List, Optional, Tuple

#: The upstream cross-entropy types that ``CheckedCrossEntropyLoss``
#: replaces, with the ``impl`` implied by their scope prefix (None: from
#: the default scope at build time).
CROSS_ENTROPY_TYPES = {
    'CrossEntropyLoss': None,
    'mmdet.CrossEntropyLoss': 'mmdet',
    'mmseg.CrossEntropyLoss': 'mmseg',
}
VALIDATE_TYPES = ('ValidateAnnotations', 'mmnanguard.ValidateAnnotations')


def swap_cross_entropy(model_cfg: Any, path: str = 'model') -> List[str]:
    """Replace every upstream ``CrossEntropyLoss`` in ``model_cfg`` in place.

    Args:
        model_cfg: The model config (dicts and lists are walked).
        path (str): Name of ``model_cfg`` for the returned paths.

    Returns:
        list[str]: Dotted paths of the replaced loss configs.
    """
    swapped: List[str] = []
    if isinstance(model_cfg, dict):
        ce_impl = CROSS_ENTROPY_TYPES.get(model_cfg.get('type'), False)
        if ce_impl is not False:
            model_cfg['type'] = 'CheckedCrossEntropyLoss'
            if ce_impl is not None:
                model_cfg.setdefault('impl', ce_impl)
            swapped.append(path)
        for key, value in model_cfg.items():
            swapped += swap_cross_entropy(value, f'{path}.{key}')
    elif isinstance(model_cfg, (list, tuple)):
        for i, value in enumerate(model_cfg):
            swapped += swap_cross_entropy(value, f'{path}[{i}]')
    return swapped


def swap_module_types(
    cfg: Any, swaps: Dict[str, str], path: str = 'model'
) -> List[str]:
    """Give every config dict whose ``type`` is a key of ``swaps`` the
    mapped type, in place (its other arguments are kept).

    Args:
        cfg: The model config (dicts and lists are walked).
        swaps (dict): Old type -> new type.
        path (str): Name of ``cfg`` for the returned paths.

    Returns:
        list[str]: ``'path: Old -> New'`` for each swap.
    """
    done: List[str] = []
    if isinstance(cfg, dict):
        old = cfg.get('type')
        if isinstance(old, str) and old in swaps:
            cfg['type'] = swaps[old]
            done.append(f'{path}: {old} -> {swaps[old]}')
        for key, value in cfg.items():
            done += swap_module_types(value, swaps, f'{path}.{key}')
    elif isinstance(cfg, (list, tuple)):
        for i, value in enumerate(cfg):
            done += swap_module_types(value, swaps, f'{path}[{i}]')
    return done


def _head_value(model_cfg: Dict[str, Any], key: str) -> Any:
    """``key`` of the first head that has it (one-stage, seg, two-stage)."""
    for head in ('bbox_head', 'decode_head'):
        value = (model_cfg.get(head) or {}).get(key)
        if value is not None:
            return value
    roi_head = (model_cfg.get('roi_head') or {}).get('bbox_head')
    if isinstance(roi_head, (list, tuple)) and roi_head:
        roi_head = roi_head[-1]
    if isinstance(roi_head, dict):
        return roi_head.get(key)
    return None


def infer_validate_settings(
    cfg: Dict[str, Any], settings: Dict[str, Any]
) -> Dict[str, Any]:
    """Fill ``num_classes``, ``angle_version`` and ``ignore_index`` of the
    ``ValidateAnnotations`` settings from the model config where unset.

    Args:
        cfg (dict): The whole config (``model``, ``angle_version``).
        settings (dict): The ``nanguard.validate_annotations`` settings.

    Returns:
        dict: The completed transform config (``type`` included).

    Raises:
        ValueError: ``num_classes`` is unset and no head names it.
    """
    out = dict(type='ValidateAnnotations', **settings)
    model = cfg.get('model') or {}
    if out.get('num_classes') is None:
        num_classes = _head_value(model, 'num_classes')
        if not isinstance(num_classes, int):
            raise ValueError(
                'nanguard.validate_annotations: cannot find num_classes in '
                'model.bbox_head, model.decode_head or model.roi_head.'
                'bbox_head; set nanguard.validate_annotations.num_classes '
                'or set nanguard.validate_annotations=None'
            )
        out['num_classes'] = num_classes
    if 'angle_version' not in out:
        coder = (model.get('bbox_head') or {}).get('bbox_coder') or {}
        angle = cfg.get('angle_version') or coder.get('angle_version')
        if angle is not None:
            out['angle_version'] = angle
    if 'ignore_index' not in out:
        ignore_index = _head_value(model, 'ignore_index')
        if isinstance(ignore_index, int):
            out['ignore_index'] = ignore_index
    return out


def _pipelines(dataset_cfg: Any) -> List[list]:
    """The ``pipeline`` lists of a dataset config, wrappers included."""
    if not isinstance(dataset_cfg, dict):
        return []
    found = []
    if isinstance(dataset_cfg.get('pipeline'), list):
        found.append(dataset_cfg['pipeline'])
    found += _pipelines(dataset_cfg.get('dataset'))
    for inner in dataset_cfg.get('datasets') or []:
        found += _pipelines(inner)
    return found


def insert_validate_annotations(
    dataloader_cfg: Dict[str, Any], transform_cfg: Dict[str, Any]
) -> Tuple[int, Optional[str]]:
    """Insert ``transform_cfg`` before the ``Pack*Inputs`` transform of
    every training pipeline, in place.

    Args:
        dataloader_cfg (dict): ``train_dataloader`` config.
        transform_cfg (dict): The ``ValidateAnnotations`` config.

    Returns:
        tuple: The number of pipelines changed, and why none was (or None).
    """
    pipelines = _pipelines(dataloader_cfg.get('dataset'))
    if not pipelines:
        return 0, 'the training dataset config has no pipeline list'
    changed = 0
    for pipeline in pipelines:
        types = [str(t.get('type', '')) for t in pipeline]
        if any(t in VALIDATE_TYPES for t in types):
            continue
        packs = [
            i
            for i, t in enumerate(types)
            if t.split('.')[-1].startswith('Pack')
        ]
        if not packs:
            continue
        pipeline.insert(packs[-1], copy.deepcopy(transform_cfg))
        changed += 1
    if changed == 0:
        return 0, (
            'every training pipeline already has ValidateAnnotations '
            'or has no Pack*Inputs transform'
        )
    return changed, None
