# Copyright (c) mmnanguard contributors. All rights reserved.
"""The config-level pieces of the include's rewrites (:mod:`.rewrite`
puts them together): module type swaps in the model config, the
``ValidateAnnotations`` settings completed from what the model says, and
its insertion into training pipelines and switch pipelines.

Each is drop-in: the model computes the same losses and the pipeline
yields the same samples, plus checks whose findings are logged or raised.
Each returns what it changed, so that the runner can log it.
"""

import copy
from typing import Any, Dict, List, Optional, Tuple

from mmnanguard.models.drop_in_resolution import drop_in_for

from .model_facts import ModelFacts, facts_from_config

VALIDATE_TYPES = ('ValidateAnnotations', 'mmnanguard.ValidateAnnotations')
#: Transforms that pack their branches themselves (mmdet's semi-supervised
#: pipelines end with one instead of ``Pack*Inputs``).
BRANCHING_TYPES = ('MultiBranch',)


def swap_module_types(
    cfg: Any,
    swaps: Dict[str, str],
    path: str = 'model',
    scope: Optional[str] = None,
) -> List[str]:
    """Give every config dict whose ``type`` is replaced by ``swaps`` the
    mapped type, in place (its other arguments are kept).

    Which types are replaced is decided by
    :func:`mmnanguard.models.drop_in_for`: with ``scope``, by the class the
    type resolves to in that scope (a bare ``'FocalLoss'`` is mmdet's in an
    mmdet or mmrotate config and is swapped, mmseg's own in an mmseg config
    and is kept); without it, by name.

    Args:
        cfg: The model config (dicts and lists are walked).
        swaps (dict): Old type -> new type.
        path (str): Name of ``cfg`` for the returned paths.
        scope (str, optional): The config's ``default_scope``.

    Returns:
        list[str]: ``'path: Old -> New'`` for each swap.
    """
    done: List[str] = []
    if isinstance(cfg, dict):
        old = cfg.get('type')
        new = drop_in_for(old, swaps, scope) if isinstance(old, str) else None
        if new is not None:
            cfg['type'] = new
            done.append(f'{path}: {old} -> {new}')
        for key, value in cfg.items():
            done += swap_module_types(value, swaps, f'{path}.{key}', scope)
    elif isinstance(cfg, (list, tuple)):
        for i, value in enumerate(cfg):
            done += swap_module_types(value, swaps, f'{path}[{i}]', scope)
    return done


def complete_validate_settings(
    settings: Dict[str, Any], facts: ModelFacts
) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """Fill ``num_classes``, ``angle_version`` and ``ignore_index`` of the
    ``ValidateAnnotations`` settings from what the model says, where unset.

    Args:
        settings (dict): The ``nanguard.validate_annotations`` settings.
        facts (ModelFacts): What the model says.

    Returns:
        tuple: The completed transform config (``type`` included), or
        None and why (with the config line that turns the check on).
    """
    out = dict(type='ValidateAnnotations', **settings)
    if out.get('num_classes') is None:
        if facts.num_classes is None:
            line = dict(settings, num_classes='N')
            args = ', '.join(
                f'{k}={v}' if k == 'num_classes' else f'{k}={v!r}'
                for k, v in line.items()
            )
            return None, (
                f'ValidateAnnotations is off: {facts.why_no_classes}. To '
                'turn it back on with N classes, add to the config: '
                f'nanguard = dict(validate_annotations=dict({args}))'
            )
        out['num_classes'] = facts.num_classes
    if 'angle_version' not in out and facts.angle_version is not None:
        out['angle_version'] = facts.angle_version
    if 'ignore_index' not in out and facts.ignore_index is not None:
        out['ignore_index'] = facts.ignore_index
    return out, None


def infer_validate_settings(
    cfg: Dict[str, Any], settings: Dict[str, Any]
) -> Dict[str, Any]:
    """:func:`complete_validate_settings` from a config, without building
    the model (the runner reads the built model instead).

    Args:
        cfg (dict): The whole config (``model``, ``angle_version``).
        settings (dict): The ``nanguard.validate_annotations`` settings.

    Returns:
        dict: The completed transform config (``type`` included).

    Raises:
        ValueError: ``num_classes`` is unset and the model config does
            not tell it.
    """
    transform, why_not = complete_validate_settings(
        settings, facts_from_config(cfg)
    )
    if transform is None:
        raise ValueError(f'nanguard.validate_annotations: {why_not}')
    return transform


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


def insert_before_pack(pipeline: List[Any], transform: Dict[str, Any]) -> bool:
    """Insert a copy of ``transform`` before the last ``Pack*Inputs`` (or
    the ``MultiBranch`` that packs each branch, as semi-supervised configs
    do) of ``pipeline``, in place, unless it has ``ValidateAnnotations``
    already.

    Args:
        pipeline (list): Transform configs.
        transform (dict): The ``ValidateAnnotations`` config.

    Returns:
        bool: Whether it was inserted.
    """
    types = [
        str(t.get('type', '')) if isinstance(t, dict) else '' for t in pipeline
    ]
    if any(t in VALIDATE_TYPES for t in types):
        return False
    packs = [
        i
        for i, t in enumerate(types)
        if t.split('.')[-1].startswith('Pack')
        or t.split('.')[-1] in BRANCHING_TYPES
    ]
    if not packs:
        return False
    pipeline.insert(packs[-1], copy.deepcopy(transform))
    return True


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
    changed = sum(insert_before_pack(p, transform_cfg) for p in pipelines)
    if changed == 0:
        return 0, (
            'every training pipeline already has ValidateAnnotations '
            'or has no Pack*Inputs transform'
        )
    return changed, None


def switch_pipelines(hooks: Optional[List[Any]]) -> List[list]:
    """The pipelines that hooks switch to during training (mmdet's
    ``PipelineSwitchHook``, used by RTMDet and rotated RTMDet), from hook
    configs or built hooks.

    Args:
        hooks (list, optional): Hook configs (dicts) or hook objects.

    Returns:
        list[list]: Each ``switch_pipeline`` list, to edit in place.
    """
    found = []
    for hook in hooks or []:
        if isinstance(hook, dict):
            pipeline = hook.get('switch_pipeline')
        else:
            pipeline = getattr(hook, 'switch_pipeline', None)
        if isinstance(pipeline, list):
            found.append(pipeline)
    return found
