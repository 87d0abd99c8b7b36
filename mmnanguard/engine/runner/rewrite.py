# Copyright (c) mmnanguard contributors. All rights reserved.
"""The rewrites behind the include, one function per stage.

:class:`NanGuardRunner` applies them around what it builds: the module
swaps to the model config before the model is built, the label check to
the built model, ``ValidateAnnotations`` (with what the built model says)
to the training dataloader config, which the runner builds only in
``train()``, and to the pipelines that hooks switch to.
:func:`rewrite_config` applies them all to a config without training
(static passes over many configs). No rewrite refuses a config: a check
that cannot be set up is turned off with a note that names the config
line turning it back on.
"""

import copy
import logging
from typing import Any, Dict, List, Optional, Tuple

import torch.nn as nn

from mmnanguard.models.drop_in_resolution import describe_kept, losses_kept

from .config_rewrites import (
    complete_validate_settings,
    insert_before_pack,
    insert_validate_annotations,
    swap_module_types,
    switch_pipelines,
)
from .label_checks import wrap_cross_entropy
from .label_range_check import hook_cross_entropy
from .model_facts import ModelFacts, facts_from_config, read_model_facts
from .protection import ProtectionSettings

#: A log level and a message.
Note = Tuple[int, str]


def rewrite_model_config(
    model_cfg: Dict[str, Any],
    protection: ProtectionSettings,
    scope: Optional[str] = None,
) -> List[Note]:
    """Apply ``nanguard.module_swaps`` to a model config, in place.

    Args:
        model_cfg (dict): The model config.
        protection (ProtectionSettings): The parsed ``nanguard`` key.
        scope (str, optional): The config's ``default_scope``, in which
            bare type names are resolved.

    Returns:
        list[Note]: What was done.
    """
    if not protection.module_swaps:
        return []
    swaps = {s['replace']: s['by'] for s in protection.module_swaps}
    done = swap_module_types(model_cfg, swaps, scope=scope)
    kept = describe_kept(losses_kept(model_cfg, swaps, scope))
    notes = [(logging.INFO, f'module swaps: {done}')] if done else []
    if kept:
        notes.append((logging.INFO, kept))
    if not done and not kept:
        notes.append(
            (
                logging.WARNING,
                f'module_swaps matched no module of the model: {swaps}',
            )
        )
    return notes


def protect_built_model(
    model: nn.Module, protection: ProtectionSettings
) -> List[Note]:
    """Apply ``nanguard.check_labels`` to a built model, in place.

    Args:
        model (nn.Module): The built model (not wrapped).
        protection (ProtectionSettings): The parsed ``nanguard`` key.

    Returns:
        list[Note]: What was done.
    """
    if not protection.check_labels:
        return []
    wrapped = wrap_cross_entropy(model)
    hooked = hook_cross_entropy(model)
    notes: List[Note] = []
    if wrapped:
        notes.append(
            (
                logging.INFO,
                f'CheckedCrossEntropyLoss wraps {wrapped} (labels checked '
                'at each call where they are class indices)',
            )
        )
    if hooked:
        notes.append(
            (
                logging.INFO,
                f'check_labels: the labels of {hooked} (a class-label '
                'cross-entropy by its values) are checked at each call',
            )
        )
    if notes:
        return notes
    return [
        (
            logging.INFO,
            'check_labels: the model has no class-label CrossEntropyLoss',
        )
    ]


def validate_transform(
    protection: ProtectionSettings, facts: ModelFacts
) -> Tuple[Optional[Dict[str, Any]], List[Note]]:
    """The ``ValidateAnnotations`` config to insert, or None.

    Args:
        protection (ProtectionSettings): The parsed ``nanguard`` key.
        facts (ModelFacts): What the model says.

    Returns:
        tuple: The transform config or None, and a WARNING note naming
        the check turned off and the config line that turns it back on.
    """
    if protection.validate_annotations is None:
        return None, []
    transform, why_not = complete_validate_settings(
        protection.validate_annotations, facts
    )
    if why_not is not None:  # the transform is None
        return None, [(logging.WARNING, why_not)]
    return transform, []


def insert_into_dataloader(
    loader_cfg: Any, transform: Optional[Dict[str, Any]]
) -> List[Note]:
    """Insert ``transform`` into every training pipeline of a dataloader
    config, in place.

    Args:
        loader_cfg: The ``train_dataloader`` config (None: no training; a
            built dataloader is left alone).
        transform (dict, optional): From :func:`validate_transform`.

    Returns:
        list[Note]: What was done.
    """
    if transform is None or loader_cfg is None:
        return []
    if not isinstance(loader_cfg, dict):
        return [
            (
                logging.WARNING,
                'ValidateAnnotations not inserted: the training '
                'dataloader is built already',
            )
        ]
    changed, why_not = insert_validate_annotations(loader_cfg, transform)
    if not changed:
        return [
            (logging.WARNING, f'ValidateAnnotations not inserted: {why_not}')
        ]
    return [
        (
            logging.INFO,
            f'{transform} inserted before Pack*Inputs in {changed} '
            'training pipeline(s)',
        )
    ]


def insert_into_switch_pipelines(
    hooks: Optional[List[Any]], transform: Optional[Dict[str, Any]]
) -> List[Note]:
    """Insert ``transform`` into the pipelines that hooks switch to (so
    that the check survives RTMDet's pipeline switch), in place.

    Args:
        hooks (list, optional): Hook configs or built hooks.
        transform (dict, optional): From :func:`validate_transform`.

    Returns:
        list[Note]: What was done.
    """
    if transform is None:
        return []
    changed = sum(
        insert_before_pack(pipeline, transform)
        for pipeline in switch_pipelines(hooks)
    )
    if not changed:
        return []
    return [
        (
            logging.INFO,
            f'ValidateAnnotations inserted into {changed} switch_pipeline(s)',
        )
    ]


def rewrite_config(
    cfg: Any, model: Optional[nn.Module] = None
) -> Tuple[Any, List[Note]]:
    """Apply every rewrite of the include to a copy of ``cfg``, without
    training; nothing is built unless ``model`` is given.

    Args:
        cfg (Config | dict): A config with the include (its ``nanguard``
            key; a config without it gets the runner's defaults).
        model (nn.Module, optional): The model built from the returned
            config, to read ``num_classes`` & co. off and to wrap its
            cross-entropy losses, as the runner does. None reads the model
            config instead and skips the label check (it needs the built
            losses).

    Returns:
        tuple: The rewritten copy of ``cfg``, and the notes (log level,
        message) the runner would log.

    Raises:
        TypeError, ValueError: The ``nanguard`` key is invalid (from
            :meth:`ProtectionSettings.from_dict`).
    """
    cfg = copy.deepcopy(cfg)
    protection = ProtectionSettings.from_dict(cfg.get('nanguard'))
    if not protection.enabled:
        return cfg, [(logging.WARNING, "policy='off': no protection added")]
    notes: List[Note] = []
    if isinstance(cfg.get('model'), dict):
        notes += rewrite_model_config(
            cfg['model'], protection, cfg.get('default_scope')
        )
    if model is not None:
        notes += protect_built_model(model, protection)
        facts = read_model_facts(model)
    else:
        facts = facts_from_config(cfg)
    transform, more = validate_transform(protection, facts)
    notes += more
    notes += insert_into_dataloader(cfg.get('train_dataloader'), transform)
    notes += insert_into_switch_pipelines(cfg.get('custom_hooks'), transform)
    return cfg, notes
