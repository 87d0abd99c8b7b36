# Copyright (c) mmnanguard contributors. All rights reserved.
"""Find the modules of a config, with their config paths, by what their
``type`` resolves to in the config's own scope (not by key names).

A *loss class* is an ``nn.Module`` subclass that lives in a ``losses``
module or whose name ends with ``Loss``.
"""

import importlib
from typing import Any, Iterator, List, NamedTuple, Optional, Tuple, Type

import torch.nn as nn
from mmengine.registry import MODELS, TASK_UTILS, DefaultScope, Registry
from typing_extensions import TypeGuard  # typing's from Python 3.10

#: Settings that a loss inherits from the modules around it (a head's
#: ``num_classes`` and ``ignore_index``, a coder's ``angle_version``).
INHERITED_KEYS = ('num_classes', 'ignore_index', 'angle_version')


class LossEntry(NamedTuple):
    """A loss config found in a model config."""

    path: str  # e.g. 'model.bbox_head.loss_bbox'
    cfg: dict  # the loss config, as written
    cls: type  # the class its type resolves to
    context: dict  # INHERITED_KEYS set by the enclosing configs


def iter_typed_configs(
    cfg: Any, path: str = 'model'
) -> Iterator[Tuple[str, dict]]:
    """Every dict with a ``type`` key nested in ``cfg``, depth first.

    Args:
        cfg: A config (dicts and lists are walked).
        path (str): Name of ``cfg`` for the yielded paths.

    Yields:
        tuple: ``(dotted path, dict)``.
    """
    if isinstance(cfg, dict):
        if 'type' in cfg:
            yield path, cfg
        for key, value in cfg.items():
            yield from iter_typed_configs(value, f'{path}.{key}')
    elif isinstance(cfg, (list, tuple)):
        for i, value in enumerate(cfg):
            yield from iter_typed_configs(value, f'{path}[{i}]')


def scoped_registry(registry: Registry, scope: Optional[str]) -> Registry:
    """The child of root ``registry`` for ``scope`` (the root itself if
    the scope has none, e.g. mmrotate's optimizers are mmengine's).

    Args:
        registry (Registry): A root registry (``MODELS``, ``OPTIMIZERS``).
        scope (str, optional): A default scope, e.g. 'mmdet'.

    Returns:
        Registry: The registry to look types up in.
    """
    if not scope or scope == registry.scope:
        return registry
    if scope not in registry.children:
        try:
            importlib.import_module(f'{scope}.registry')
        except ImportError:
            return registry
    return registry.children.get(scope, registry)


def resolve_type(
    type_name: Any, scope: Optional[str], registry: Registry = MODELS
) -> Optional[type]:
    """The class that ``type_name`` names in ``registry`` under ``scope``.

    Args:
        type_name (str | type): A ``type`` value of a config.
        scope (str, optional): The config's ``default_scope``.
        registry (Registry): Root registry. Defaults to ``MODELS``.

    Returns:
        type, optional: The class, or None if nothing is registered under
        that name.
    """
    if isinstance(type_name, type):
        return type_name
    if not isinstance(type_name, str):
        return None
    with DefaultScope.overwrite_default_scope(scope):
        return scoped_registry(registry, scope).get(type_name)


def is_loss_class(cls: Any) -> TypeGuard[Type[nn.Module]]:
    """Whether ``cls`` is a loss class (see the module docstring)."""
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        return False
    return (
        '.losses' in cls.__module__
        or cls.__module__.endswith('loss')
        or cls.__name__.endswith('Loss')
    )


def find_loss_configs(
    cfg: Any,
    scope: Optional[str],
    path: str = 'model',
    context: Optional[dict] = None,
) -> List[LossEntry]:
    """Every loss config in ``cfg`` (a loss's own sub-configs are not
    searched).

    Args:
        cfg: The model config.
        scope (str, optional): The config's ``default_scope``.
        path (str): Name of ``cfg`` for the paths. Defaults to 'model'.
        context (dict, optional): :data:`INHERITED_KEYS` set above
            ``cfg``. Defaults to None.

    Returns:
        list[LossEntry]: In config order.
    """
    context = dict(context or {})
    found: List[LossEntry] = []
    if isinstance(cfg, dict):
        cls = resolve_type(cfg.get('type'), scope) if 'type' in cfg else None
        if is_loss_class(cls):
            return [LossEntry(path, cfg, cls, context)]
        context.update(
            (k, cfg[k]) for k in INHERITED_KEYS if cfg.get(k) is not None
        )
        for key, value in cfg.items():
            found += find_loss_configs(value, scope, f'{path}.{key}', context)
    elif isinstance(cfg, (list, tuple)):
        for i, value in enumerate(cfg):
            found += find_loss_configs(value, scope, f'{path}[{i}]', context)
    return found


def build_in_scope(
    cfg: dict, scope: Optional[str], registry: Registry = MODELS
) -> Any:
    """Build ``cfg`` from ``registry`` with ``scope`` as default scope.

    Args:
        cfg (dict): A module config.
        scope (str, optional): The config's ``default_scope``.
        registry (Registry): Root registry. Defaults to ``MODELS``.

    Returns:
        The built object.
    """
    with DefaultScope.overwrite_default_scope(scope):
        return scoped_registry(registry, scope).build(dict(cfg))


def named_loss_modules(
    model: nn.Module, prefix: str = 'model'
) -> List[Tuple[str, nn.Module]]:
    """The loss modules of a built model (a loss inside a loss is left
    out).

    Args:
        model (nn.Module): A built model.
        prefix (str): Name of ``model`` in the returned paths.

    Returns:
        list[tuple]: ``(dotted path, module)``.
    """
    found: List[Tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if not is_loss_class(type(module)):
            continue
        if any(name.startswith(f'{outer}.') for outer, _ in found):
            continue
        found.append((name, module))
    return [(f'{prefix}.{name}' if name else prefix, m) for name, m in found]


def unresolved_losses(
    cfg: Any, scope: Optional[str], path: str = 'model'
) -> List[Tuple[str, str]]:
    """Typed configs whose type is named like a loss (``'loss'`` or
    ``'Los'`` in it, e.g. the typo ``'FocalLos'``) but is registered
    neither as a model nor as a task util: they cannot be checked.

    Args:
        cfg: The model config.
        scope (str, optional): The config's ``default_scope``.
        path (str): Name of ``cfg`` for the paths. Defaults to 'model'.

    Returns:
        list[tuple]: ``(path, type name)``.
    """
    return [
        (p, c['type'])
        for p, c in iter_typed_configs(cfg, path)
        if isinstance(c['type'], str)
        and 'los' in c['type'].lower()
        and resolve_type(c['type'], scope) is None
        and resolve_type(c['type'], scope, TASK_UTILS) is None
    ]
