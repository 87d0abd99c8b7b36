# Copyright (c) mmnanguard contributors. All rights reserved.
"""Which drop-in replaces a config's module type, decided by what the type
means in the config's scope.

A bare type name means different modules in different scopes: in an mmdet
or mmrotate config ``type='FocalLoss'`` is mmdet's focal loss (mmrotate's
registry falls back to its parent, mmdet's), in an mmseg config it is
mmseg's own ``FocalLoss``, another loss with other arguments
(``class_weight``, ``loss_name``) that ``StableFocalLoss`` must not
replace. :func:`drop_in_for` resolves the config's type and every scoped
swap key (``'mmdet.FocalLoss'``) to the registered classes and swaps only
where they are the same class.
"""

from typing import Any, Dict, List, Mapping, Optional, Tuple

from mmengine.registry import MODELS, TASK_UTILS

#: The registries whose types the safe modules replace: losses and coders.
ROOTS = (MODELS, TASK_UTILS)


def resolve_type(type_name: str, scope: str) -> Optional[type]:
    """The class that ``type_name`` names when built in ``scope``.

    Args:
        type_name (str): A config's ``type``, bare or scoped
            (``'mmdet.FocalLoss'``).
        scope (str): The config's ``default_scope`` (``'mmdet'``,
            ``'mmrotate'``, ``'mmseg'``, ``'mmengine'``).

    Returns:
        type | None: The class in the model or task-util registry tree, or
        None if neither has it.
    """
    for root in ROOTS:
        with root.switch_scope_and_registry(scope) as registry:
            found = registry.get(type_name)
        if found is not None:
            return found
    return None


def scoped_targets(swaps: Mapping[str, str], scope: str) -> Dict[type, str]:
    """The classes that the scoped swap keys name, each with its drop-in.

    Args:
        swaps (Mapping[str, str]): Upstream type -> drop-in type, as in
            ``nanguard.module_swaps``.
        scope (str): The config's ``default_scope``.

    Returns:
        dict: Class -> drop-in type, for every key with a scope prefix that
        resolves.
    """
    targets: Dict[type, str] = {}
    for key, by in swaps.items():
        if '.' not in key:
            continue
        cls = resolve_type(key, scope)
        if cls is not None:
            targets[cls] = by
    return targets


def drop_in_for(
    type_name: str, swaps: Mapping[str, str], scope: Optional[str] = None
) -> Optional[str]:
    """The drop-in type that replaces ``type_name``, or None.

    Without a scope, the names are compared as strings (``swaps`` must then
    list every spelling). With one, ``type_name`` is resolved in it and
    replaced where it is the class of a scoped key of ``swaps``: a bare
    ``'FocalLoss'`` is replaced in an mmdet or mmrotate config and kept in
    an mmseg one, whatever bare keys ``swaps`` lists. A name that does not
    resolve (it would not build either) falls back to the string match.

    Args:
        type_name (str): A config's ``type``.
        swaps (Mapping[str, str]): Upstream type -> drop-in type.
        scope (str, optional): The config's ``default_scope``.
            Defaults to None.

    Returns:
        str | None: The drop-in's type name, or None to keep the module.
    """
    if scope is None:
        return swaps.get(type_name)
    cls = resolve_type(type_name, scope)
    if cls is None:
        return swaps.get(type_name)
    return scoped_targets(swaps, scope).get(cls)


#: Losses with a known NaN failure that no drop-in fixes, and why.
NO_DROP_IN = {
    'GDLoss_v1': (
        "mmrotate's GDLoss_v1 has no drop-in: the NaN users report with it, "
        'from the first iteration, comes from feeding it encoded deltas '
        '(its head has reg_decoded_bbox=False), which no drop-in can fix; '
        'set reg_decoded_bbox=True in its head (tools/doctor.py reports '
        'it). Its degenerate-box failures (zero width, fp16/bf16) are '
        'listed by tools/check_loss.py'
    ),
    'CTCModuleLoss': (
        "mmocr's CTCModuleLoss has no drop-in: its loss is inf for a text "
        'label that CTC cannot align to the output (longer than it, or '
        'with equal neighbours that need a blank between them), which a '
        'drop-in cannot fix; set zero_infinity=True on it (tools/doctor.py '
        'reports it: ctc-zero-infinity) or drop such labels '
        '(tools/check_dataset.py names them: ctc_alignment)'
    ),
}


def losses_kept(
    model_cfg: Any, swaps: Mapping[str, str], scope: Optional[str] = None
) -> List[Tuple[str, str]]:
    """The losses of a model config that ``swaps`` leaves as they are.

    Args:
        model_cfg: The model config (after the swaps, or before).
        swaps (Mapping[str, str]): Upstream type -> drop-in type.
        scope (str, optional): The config's ``default_scope``.

    Returns:
        list[tuple[str, str]]: ``(config path, 'Class (module)')`` of each
        loss that is no swap's target (a drop-in already in place
        included), in config order.
    """
    from mmnanguard.config_walk import find_loss_configs

    kept = []
    for entry in find_loss_configs(model_cfg, scope):
        name = entry.cfg.get('type')
        name = name if isinstance(name, str) else entry.cls.__name__
        if drop_in_for(name, swaps, scope) is None:
            top = entry.cls.__module__.split('.')[0]
            kept.append((entry.path, f'{entry.cls.__name__} ({top})'))
    return kept


def describe_kept(kept: List[Tuple[str, str]]) -> str:
    """One log line: the losses kept as they are (no drop-in replaces
    them), and the ones with a known failure that no drop-in fixes (with
    the reason, :data:`NO_DROP_IN`).

    Args:
        kept (list): From :func:`losses_kept`.

    Returns:
        str: The line ('' when nothing was kept).
    """
    if not kept:
        return ''
    unfixable = [k for k in kept if k[1].split(' ')[0] in NO_DROP_IN]
    plain = [k for k in kept if k not in unfixable]
    parts = []
    if plain:
        listed = ', '.join(f'{path} ({what})' for path, what in plain)
        parts.append(
            f'module swaps: kept {len(plain)} loss(es) as configured, '
            f'with no drop-in for them: {listed}.'
        )
    for path, what in unfixable:
        parts.append(
            f'module swaps: kept {path} ({what}): '
            f'{NO_DROP_IN[what.split(" ")[0]]}.'
        )
    return ' '.join(parts)
