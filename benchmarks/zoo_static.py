# Copyright (c) mmnanguard contributors. All rights reserved.
"""The static pass of the zoo sweep: every upstream config, with the
include, rewritten as the runner rewrites it, without training.

Per config (:func:`static_check`):

1. load it as a user includes the guard (a config whose ``_base_`` lists
   the upstream config and ``mmnanguard::_base_/nanguard.py``); when that
   fails, load the upstream config alone, to tell a config that does not
   load upstream either (``upstream_load_error``) from one the include
   breaks (``include_load_error``);
2. apply the runner's rewrites
   (:func:`mmnanguard.engine.runner.rewrite.rewrite_config`, reading what
   the model config says, as nothing is built): a ``TypeError`` or
   ``ValueError`` is a refusal (``refused``), any other exception a
   crash (``rewrite_error``);
3. build what the rewrites added that is cheap to build: the guard's
   hooks (``NanGuardHook`` and ``nanguard.hooks``) and every
   ``ValidateAnnotations`` inserted into a pipeline (``build_error``).

The notes the runner logs at WARNING (a check turned off, and the config
line that turns it back on) are kept. Models are not built: with every
backbone of the zoo, on two cores, that would take hours.
"""

import logging
import time
import traceback
from typing import Any, Dict, List

#: Static outcomes, in table order.
STATUSES = (
    'ok',
    'refused',
    'rewrite_error',
    'build_error',
    'include_load_error',
    'upstream_load_error',
)


#: Module type (in a model config) -> the mmcv 2.0.1 op without a CPU
#: kernel that it runs in training (read off the modules' code; the
#: training sweep shows each of them stop a family).
CPU_KERNEL_TYPES = {
    'RotatedIoULoss': 'diff_iou_rotated',
    'ConvexGIoULoss': 'convex_giou',
    'BCConvexGIoULoss': 'convex_giou',
    'MaxConvexIoUAssigner': 'convex_iou',
    'SASAssigner': 'convex_iou',
    'ConvexAssigner': 'convex_iou',
    'RotatedRepPointsHead': 'min_area_polygons',
    'OrientedRepPointsHead': 'min_area_polygons',
    'RiRoIAlignRotated': 'riroi_align_rotated',
    'FPN_CARAFE': 'carafe',
    'carafe': 'carafe',
}


def cpu_kernel_ops(cfg: Any) -> List[str]:
    """The ops of :data:`CPU_KERNEL_TYPES` that a model config uses."""
    found = set()
    if isinstance(cfg, dict):
        name = str(cfg.get('type', '')).rpartition('.')[2]
        if name in CPU_KERNEL_TYPES:
            found.add(CPU_KERNEL_TYPES[name])
        for value in cfg.values():
            found.update(cpu_kernel_ops(value))
    elif isinstance(cfg, (list, tuple)):
        for value in cfg:
            found.update(cpu_kernel_ops(value))
    return sorted(found)


def _error(err: BaseException) -> str:
    text = f'{type(err).__name__}: {err}'.strip().splitlines()
    return (text[0] if text else type(err).__name__)[:400]


def _failure(err: BaseException) -> Dict[str, str]:
    """The error and the function that raised it."""
    frames = traceback.extract_tb(err.__traceback__)
    where = f'{frames[-1].filename}:{frames[-1].lineno}' if frames else '?'
    return dict(error=_error(err), where=where)


def _inserted_transforms(cfg: Any) -> List[Dict[str, Any]]:
    """Every ``ValidateAnnotations`` config in the rewritten training
    pipelines (switch pipelines of hooks included)."""
    from shrink_data import dataset_pipelines

    loader = cfg.get('train_dataloader') or {}
    pipelines = dataset_pipelines(loader.get('dataset'))
    for hook in cfg.get('custom_hooks') or []:
        if isinstance(hook, dict) and isinstance(
            hook.get('switch_pipeline'), list
        ):
            pipelines.append(hook['switch_pipeline'])
    return [
        t
        for pipeline in pipelines
        for t in pipeline
        if isinstance(t, dict)
        and str(t.get('type', '')).endswith('ValidateAnnotations')
    ]


def build_added_pieces(cfg: Any) -> List[str]:
    """Build the guard's hooks (every hook of ``nanguard.hooks``, the
    AMP-only ones too) and every inserted ``ValidateAnnotations``.

    Args:
        cfg (Config): The rewritten config.

    Returns:
        list[str]: The type names built.
    """
    from mmnanguard.engine.hooks import NanGuardHook
    from mmnanguard.engine.runner import ProtectionSettings
    from mmnanguard.registry import HOOKS, TRANSFORMS

    protection = ProtectionSettings.from_dict(cfg.get('nanguard'))
    built = [type(NanGuardHook(**protection.guard)).__name__]
    for hook_cfg in protection.hooks:
        hook_cfg = {k: v for k, v in hook_cfg.items() if k != 'when'}
        built.append(type(HOOKS.build(hook_cfg)).__name__)
    for transform in _inserted_transforms(cfg):
        built.append(type(TRANSFORMS.build(dict(transform))).__name__)
    return built


def static_check(config: str, tmp_dir: str) -> Dict[str, Any]:
    """The static pass on one upstream config.

    Args:
        config (str): ``'mmdet::faster_rcnn/x.py'``.
        tmp_dir (str): Where the two-line including config is written.

    Returns:
        dict: ``status`` (one of :data:`STATUSES`), ``error``, ``warnings``
        (the runner's WARNING notes), ``built``, ``has_model``,
        ``cpu_kernels`` (:func:`cpu_kernel_ops`), ``wall_s``.
    """
    from zoo_cell import load_with_include
    from zoo_families import family_of

    from mmnanguard.engine.runner.rewrite import rewrite_config

    result: Dict[str, Any] = dict(config=config, family=family_of(config))
    start = time.perf_counter()
    try:
        cfg = load_with_include(config, tmp_dir)
    except Exception as err:  # the config's failure is its result
        result['error'] = _error(err)
        try:
            load_with_include(config, tmp_dir, include='none')
            result['status'] = 'include_load_error'
        except Exception as upstream:  # noqa: B014 (reported, not raised)
            result.update(status='upstream_load_error', error=_error(upstream))
        result['wall_s'] = round(time.perf_counter() - start, 2)
        return result
    result['has_model'] = isinstance(cfg.get('model'), dict)
    result['cpu_kernels'] = cpu_kernel_ops(cfg.get('model'))
    try:
        rewritten, notes = rewrite_config(cfg)
    except (TypeError, ValueError) as err:
        result.update(status='refused', **_failure(err))
    except Exception as err:  # the config's failure is its result
        result.update(status='rewrite_error', **_failure(err))
    else:
        result['warnings'] = [m for lvl, m in notes if lvl >= logging.WARNING]
        try:
            result.update(status='ok', built=build_added_pieces(rewritten))
        except Exception as err:  # the config's failure is its result
            result.update(status='build_error', **_failure(err))
    result['wall_s'] = round(time.perf_counter() - start, 2)
    return result
