# Copyright (c) mmnanguard contributors. All rights reserved.
"""What the protection reads off a built model: the class count that
annotation labels must respect, the rotated boxes' angle version and the
segmentation ignore index.

Reading the built modules instead of config keys covers every head
layout at once: one- and two-stage heads, cascade lists, refine heads
(``bbox_head_init`` / ``bbox_head_refine``), list-valued ``decode_head``
and auxiliary heads, query-based heads and semi-supervised wrappers.
"""

import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch.nn as nn

#: Why an RPN's ``num_classes`` is no bound for the dataset's labels.
RPN_LABELS = (
    'the model is an RPN, whose head sees every label as 0, so '
    "no head's num_classes bounds the dataset's labels"
)
#: Top-level parts whose modules say nothing about the labels.
_NOT_HEADS = ('backbone', 'neck', 'data_preprocessor')


@dataclass
class ModelFacts:
    """What :func:`read_model_facts` found.

    Args:
        num_classes (int, optional): The largest class count of the heads
            that consume the dataset's labels; None where unknown.
        num_classes_from (list[str]): The modules it was read from.
        why_no_classes (str, optional): Why ``num_classes`` is None.
        angle_version (str, optional): The rotated boxes' angle version.
        ignore_index (int, optional): The decode heads' ignore index.
    """

    num_classes: Optional[int] = None
    num_classes_from: Tuple[str, ...] = ()
    why_no_classes: Optional[str] = None
    angle_version: Optional[str] = None
    ignore_index: Optional[int] = None


def _is_head(name: str) -> bool:
    return not any(part in _NOT_HEADS for part in name.split('.'))


def _int_attr(obj: Any, key: str) -> Optional[int]:
    value = getattr(obj, key, None)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def _angle_versions(module: nn.Module) -> List[str]:
    """``angle_version`` of the module and of its plain (non-module)
    attributes: box coders and prior generators are task utilities, not
    submodules."""
    found = []
    for obj in [module] + list(vars(module).values()):
        value = getattr(obj, 'angle_version', None)
        if isinstance(value, str):
            found.append(value)
    return found


def _labels_reach_no_classifier(model: nn.Module) -> Optional[str]:
    """Why the dataset's labels never reach a classifier, or None.

    mmdet's ``RPN`` detector sets every ground-truth label to 0 before
    its head sees it, so its ``num_classes=1`` is no bound for the data.
    """
    rpn_module = sys.modules.get('mmdet.models.detectors.rpn')
    rpn = getattr(rpn_module, 'RPN', None)
    if rpn is not None and isinstance(model, rpn):
        return RPN_LABELS
    return None


def read_model_facts(model: nn.Module) -> ModelFacts:
    """Read ``num_classes``, ``angle_version`` and ``ignore_index`` off
    the modules of a built model.

    ``num_classes`` is the largest ``num_classes`` attribute of the modules
    outside the backbone, neck and data preprocessor (a two-stage
    detector's RPN head has 1, its ROI heads have the dataset's count).

    Args:
        model (nn.Module): The built model (not wrapped).

    Returns:
        ModelFacts: What was found.
    """
    classes: Dict[str, int] = {}
    angles: List[str] = []
    ignores: List[int] = []
    for name, module in model.named_modules():
        if not _is_head(name):
            continue
        angles += _angle_versions(module)
        num_classes = _int_attr(module, 'num_classes')
        if num_classes is None or num_classes <= 0:
            continue
        classes[name or 'model'] = num_classes
        ignore = _int_attr(module, 'ignore_index')
        if ignore is not None:
            ignores.append(ignore)
    facts = ModelFacts(
        angle_version=angles[0] if angles else None,
        ignore_index=ignores[0] if ignores else None,
    )
    why = _labels_reach_no_classifier(model)
    if why is None and not classes:
        why = (
            f'no module of {type(model).__name__} outside the backbone '
            'and neck has an integer num_classes'
        )
    if why is not None:
        facts.why_no_classes = why
        return facts
    facts.num_classes = max(classes.values())
    facts.num_classes_from = tuple(
        name for name, n in classes.items() if n == facts.num_classes
    )
    return facts


def _config_values(
    cfg: Any, key: str, path: str = 'model'
) -> List[Tuple[str, Any]]:
    """``(path, value)`` of every ``key`` in the dicts of ``cfg`` outside
    the backbone, neck and data preprocessor."""
    found: List[Tuple[str, Any]] = []
    if isinstance(cfg, dict):
        if key in cfg:
            found.append((path, cfg[key]))
        for name, value in cfg.items():
            if name not in _NOT_HEADS:
                found += _config_values(value, key, f'{path}.{name}')
    elif isinstance(cfg, (list, tuple)):
        for i, value in enumerate(cfg):
            found += _config_values(value, key, f'{path}[{i}]')
    return found


def _panoptic_counts(model_cfg: Any) -> List[Tuple[str, Any]]:
    """``num_things_classes + num_stuff_classes`` of the MaskFormer-style
    heads, which build their ``num_classes`` from the two."""
    things = dict(_config_values(model_cfg, 'num_things_classes'))
    stuff = dict(_config_values(model_cfg, 'num_stuff_classes'))
    return [
        (path, things[path] + stuff[path])
        for path in things
        if isinstance(things[path], int) and isinstance(stuff.get(path), int)
    ]


def facts_from_config(cfg: Dict[str, Any]) -> ModelFacts:
    """:func:`read_model_facts` from a config, without building the model
    (for static passes over many configs; the runner reads the built
    model). The same rules, applied to the model config's dicts.

    Args:
        cfg (dict): The whole config (``model``, ``angle_version``).

    Returns:
        ModelFacts: What was found.
    """
    model = cfg.get('model') or {}
    classes = [
        (path, value)
        for path, value in _config_values(model, 'num_classes')
        + _panoptic_counts(model)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0
    ]
    angles = [
        value
        for _, value in _config_values(model, 'angle_version')
        if isinstance(value, str)
    ]
    if isinstance(cfg.get('angle_version'), str):
        angles.insert(0, cfg['angle_version'])
    ignores = [
        value
        for _, value in _config_values(model, 'ignore_index')
        if isinstance(value, int) and not isinstance(value, bool)
    ]
    facts = ModelFacts(
        angle_version=angles[0] if angles else None,
        ignore_index=ignores[0] if ignores else None,
    )
    if str(model.get('type', '')).split('.')[-1] == 'RPN':
        facts.why_no_classes = RPN_LABELS
    elif not classes:
        facts.why_no_classes = (
            'no dict of the model config outside the backbone and neck '
            'has an integer num_classes'
        )
    else:
        facts.num_classes = max(value for _, value in classes)
        facts.num_classes_from = tuple(
            path for path, value in classes if value == facts.num_classes
        )
    return facts
