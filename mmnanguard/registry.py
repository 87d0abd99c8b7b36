# Copyright (c) mmnanguard contributors. All rights reserved.
"""mmnanguard provides 6 registry nodes (hooks, runners, optimizer
wrappers, models, task utils, transforms) to support using modules across
projects. Each node is a child of the root registry in MMEngine.

More details can be found at
https://mmengine.readthedocs.io/en/latest/advanced_tutorials/registry.html.

mmdet, mmrotate and mmseg configs build their modules through their own
registries, whose ancestors are MMEngine's root registries. A module that
their configs must find by its bare type name (``type='NanGuardHook'``,
``type='StableFocalLoss'``, ``type='ValidateAnnotations'``) is therefore
registered with :func:`register_shared`: in the mmnanguard child registry
(reachable as ``mmnanguard.NAME``) and in the root (reachable from every
downstream scope by ``NAME``).
"""

from typing import Callable, Type

from mmengine.registry import HOOKS as MMENGINE_HOOKS
from mmengine.registry import MODELS as MMENGINE_MODELS
from mmengine.registry import OPTIM_WRAPPERS as MMENGINE_OPTIM_WRAPPERS
from mmengine.registry import RUNNERS as MMENGINE_RUNNERS
from mmengine.registry import TASK_UTILS as MMENGINE_TASK_UTILS
from mmengine.registry import TRANSFORMS as MMENGINE_TRANSFORMS
from mmengine.registry import Registry

# Hooks: NanGuardHook, AmpScaleMonitorHook, ...
HOOKS = Registry(
    'hook', parent=MMENGINE_HOOKS, locations=['mmnanguard.engine.hooks']
)
# Runners that add the guard to any config (``runner_type``).
RUNNERS = Registry(
    'runner', parent=MMENGINE_RUNNERS, locations=['mmnanguard.engine.runner']
)
# Optimizer wrappers (CPU-capable AMP for tests).
OPTIM_WRAPPERS = Registry(
    'optim_wrapper',
    parent=MMENGINE_OPTIM_WRAPPERS,
    locations=['mmnanguard.engine.optimizers'],
)
# Numerically safe losses.
MODELS = Registry(
    'model', parent=MMENGINE_MODELS, locations=['mmnanguard.models']
)
# Box and angle coders.
TASK_UTILS = Registry(
    'task util',
    parent=MMENGINE_TASK_UTILS,
    locations=['mmnanguard.models.task_modules'],
)
# Data transforms (annotation validation).
TRANSFORMS = Registry(
    'transform',
    parent=MMENGINE_TRANSFORMS,
    locations=['mmnanguard.datasets.transforms'],
)


def register_shared(registry: Registry) -> Callable[[Type], Type]:
    """Register a class in ``registry`` and in that registry's root.

    Args:
        registry (Registry): One of the mmnanguard registries above.

    Returns:
        Callable: A class decorator.

    Example:
        >>> @register_shared(HOOKS)
        ... class MyHook(Hook):
        ...     pass
        >>> # mmdet / mmrotate / mmseg configs: dict(type='MyHook')
        >>> # anywhere: dict(type='mmnanguard.MyHook')
    """

    def _register(cls: Type) -> Type:
        registry.register_module(module=cls)
        registry.parent.register_module(module=cls)
        return cls

    return _register
