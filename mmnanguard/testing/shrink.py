# Copyright (c) mmnanguard contributors. All rights reserved.
"""Shrink any upstream mmdet / mmrotate / mmseg model config for the CPU.

:func:`shrink_model` keeps the model as upstream has it apart from what
makes it slow or needs a download:

* a ResNet-like backbone (``ResNet``, ``ResNetV1c``, ``ResNetV1d``,
  ``ResNeXt``, ``Res2Net``, ``ResNeSt``) becomes a ResNet-18 of the same
  family (stages, strides, dilations, ``out_indices`` and style kept),
  and the ``in_channels`` of what reads the backbone's outputs (the first
  neck, or the heads where there is no neck) are mapped to ResNet-18's
  stage widths;
* every ``SyncBN`` becomes ``BN`` (same arguments);
* every pretrained weight (``init_cfg=dict(type='Pretrained')``,
  ``pretrained=...``) is dropped.

:func:`shrink_runtime` turns the schedule into a few iterations without
validation, and :func:`scale_image_sizes` scales every image size of the
training pipeline and of the data preprocessor by one factor.
Each returns notes (``'path: what changed'``) so that a caller can show
what was done to the upstream config.
"""

import math
import uuid
from typing import Any, Dict, List, Optional, Sequence, Tuple

#: Backbone types whose stages are ResNet stages; the value is the type
#: of the ResNet-18 that replaces it (same scope prefix kept).
RESNET_LIKE = {
    'ResNet': 'ResNet',
    'ResNetV1c': 'ResNetV1c',
    'ResNetV1d': 'ResNetV1d',
    'ResNeXt': 'ResNet',
    'Res2Net': 'ResNet',
    'ResNeSt': 'ResNet',
}
#: ResNet arguments that a ResNet-18 takes over from the replaced backbone.
RESNET_KEPT_KEYS = (
    'num_stages',
    'out_indices',
    'frozen_stages',
    'norm_eval',
    'style',
    'strides',
    'dilations',
    'contract_dilation',
    'zero_init_residual',
    'avg_down',
    'deep_stem',
    'multi_grid',
    'conv_cfg',
)
#: ResNet arguments that only bottleneck blocks (depth >= 50) take: a
#: backbone with one of them keeps its depth (deformable convolutions and
#: plugins are the point of configs that set them).
BOTTLENECK_ONLY_KEYS = ('dcn', 'plugins', 'gen_attention')
#: Necks that hand some backbone outputs to the heads unchanged (JPU): a
#: head's ``in_channels`` may then be a backbone width or the neck's own,
#: so the backbone keeps its depth.
PASS_THROUGH_NECKS = ('JPU',)
#: Normalisation layer types replaced by ``BN`` (the part after the scope).
SYNC_NORMS = ('SyncBN', 'MMSyncBN', 'NaiveSyncBN', 'naiveSyncBN')
#: Keys of a head config that take the backbone's channels directly.
HEAD_CHANNEL_KEYS = ('in_channels', 'c1_in_channels')
#: Pipeline / preprocessor keys that hold image sizes in pixels.
SIZE_KEYS = (
    'scale',
    'img_scale',
    'scales',
    'crop_size',
    'size',
    'border',
    'random_size_range',
)
#: Of those, the ones that give the size the images are resized to.
RESIZE_KEYS = ('scale', 'img_scale', 'scales')


def _short_type(cfg: Any) -> str:
    value = cfg.get('type') if isinstance(cfg, dict) else None
    return value.rpartition('.')[2] if isinstance(value, str) else ''


def _stage_widths(num_stages: int, expansion: int) -> List[int]:
    return [64 * expansion * 2**i for i in range(num_stages)]


def replace_resnet_backbone(model: Dict[str, Any]) -> Optional[Dict[int, int]]:
    """Make a ResNet-like ``model['backbone']`` a ResNet-18, in place.

    Args:
        model (dict): The model config.

    Returns:
        dict or None: Old stage width -> new stage width, or None when the
        backbone is not ResNet-like, has deformable convolutions or
        plugins, or feeds a pass-through neck (nothing changed).
    """
    backbone = model.get('backbone')
    name = _short_type(backbone)
    necks = model.get('neck')
    necks = necks if isinstance(necks, (list, tuple)) else [necks]
    if (
        name not in RESNET_LIKE
        or any(backbone.get(key) for key in BOTTLENECK_ONLY_KEYS)
        or any(_short_type(n) in PASS_THROUGH_NECKS for n in necks)
    ):
        return None
    scope = backbone['type'][: -len(name)]
    depth = int(backbone.get('depth', 50))
    num_stages = int(backbone.get('num_stages', 4))
    expansion = (
        1
        if name in ('ResNet', 'ResNetV1c', 'ResNetV1d') and (depth in (18, 34))
        else 4
    )
    new = dict(type=scope + RESNET_LIKE[name], depth=18)
    for key in RESNET_KEPT_KEYS:
        if key in backbone:
            new[key] = backbone[key]
    norm = dict(backbone.get('norm_cfg') or dict(type='BN'))
    new['norm_cfg'] = norm
    new['init_cfg'] = None
    model['backbone'] = new
    old = _stage_widths(num_stages, expansion)
    return dict(zip(old, _stage_widths(num_stages, 1)))


def _map_channels(value: Any, widths: Dict[int, int]) -> Any:
    if isinstance(value, int):
        return widths.get(value, value)
    if isinstance(value, (list, tuple)):
        return type(value)(widths.get(v, v) for v in value)
    return value


def fix_backbone_channels(
    model: Dict[str, Any], widths: Dict[int, int]
) -> List[str]:
    """Map the ``in_channels`` of what reads the backbone's outputs.

    With a neck, that is the first neck; without one, every ``*_head`` of
    the model (a list-valued head: each of its entries), and a head nested
    in one of them that has an ``in_index`` (it reads backbone outputs).

    Args:
        model (dict): The model config, changed in place.
        widths (dict): Old stage width -> new stage width.

    Returns:
        list[str]: ``'path: old -> new'`` per changed key.
    """
    notes: List[str] = []

    def fix(cfg: Any, path: str) -> None:
        if not isinstance(cfg, dict):
            return
        for key in HEAD_CHANNEL_KEYS:
            if key in cfg:
                new = _map_channels(cfg[key], widths)
                if new != cfg[key]:
                    notes.append(f'{path}.{key}: {cfg[key]} -> {new}')
                    cfg[key] = new
        # a head inside a head that reads backbone features itself (it
        # has an in_index), e.g. KNet's kernel_generate_head
        for inner_path, inner in _heads(cfg, path):
            if inner.get('in_index') is not None:
                fix(inner, inner_path)

    neck = model.get('neck')
    if isinstance(neck, (list, tuple)) and neck:
        fix(neck[0], 'model.neck[0]')
    elif isinstance(neck, dict):
        fix(neck, 'model.neck')
    else:
        for path, head in _heads(model, 'model'):
            fix(head, path)
    return notes


def _heads(cfg: Dict[str, Any], path: str) -> List[Tuple[str, Dict]]:
    """``(path, config)`` of every ``*_head`` entry of ``cfg`` (each
    entry of a list-valued one)."""
    found = []
    for key, head in cfg.items():
        if not key.endswith('_head'):
            continue
        if isinstance(head, dict):
            found.append((f'{path}.{key}', head))
        elif isinstance(head, (list, tuple)):
            found += [
                (f'{path}.{key}[{i}]', h)
                for i, h in enumerate(head)
                if isinstance(h, dict)
            ]
    return found


def replace_sync_norms(cfg: Any, path: str = 'model') -> List[str]:
    """Give every ``SyncBN``-like norm config ``type='BN'``, in place.

    Returns:
        list[str]: The changed paths.
    """
    done: List[str] = []
    if isinstance(cfg, dict):
        if _short_type(cfg) in SYNC_NORMS:
            cfg['type'] = 'BN'
            done.append(path)
        for key, value in cfg.items():
            done += replace_sync_norms(value, f'{path}.{key}')
    elif isinstance(cfg, (list, tuple)):
        for i, value in enumerate(cfg):
            done += replace_sync_norms(value, f'{path}[{i}]')
    return done


def _is_pretrained(init_cfg: Any) -> bool:
    return isinstance(init_cfg, dict) and (
        init_cfg.get('type') == 'Pretrained' or 'checkpoint' in init_cfg
    )


def drop_pretrained(cfg: Any, path: str = 'model') -> List[str]:
    """Drop every pretrained weight of a model config, in place.

    ``init_cfg`` entries that load a checkpoint are removed (a list keeps
    its other entries), ``pretrained=...`` becomes None.

    Returns:
        list[str]: The changed paths.
    """
    done: List[str] = []
    if isinstance(cfg, dict):
        init_cfg = cfg.get('init_cfg')
        if _is_pretrained(init_cfg):
            cfg['init_cfg'] = None
            done.append(f'{path}.init_cfg')
        elif isinstance(init_cfg, list) and any(map(_is_pretrained, init_cfg)):
            cfg['init_cfg'] = [c for c in init_cfg if not _is_pretrained(c)]
            done.append(f'{path}.init_cfg')
        if isinstance(cfg.get('pretrained'), str):
            cfg['pretrained'] = None
            done.append(f'{path}.pretrained')
        for key, value in cfg.items():
            if key != 'init_cfg':
                done += drop_pretrained(value, f'{path}.{key}')
    elif isinstance(cfg, (list, tuple)):
        for i, value in enumerate(cfg):
            done += drop_pretrained(value, f'{path}[{i}]')
    return done


def shrink_model(model: Dict[str, Any]) -> List[str]:
    """Apply the model shrink of this module to ``model``, in place.

    Args:
        model (dict): The ``model`` config.

    Returns:
        list[str]: What was changed.
    """
    notes: List[str] = []
    old_type = (model.get('backbone') or {}).get('type')
    widths = replace_resnet_backbone(model)
    if widths is not None:
        notes.append(f'model.backbone: {old_type} -> ResNet-18')
        notes += fix_backbone_channels(model, widths)
    notes += [f'{p}: SyncBN -> BN' for p in replace_sync_norms(model)]
    notes += [f'{p}: pretrained dropped' for p in drop_pretrained(model)]
    return notes


def _round_size(value: float) -> int:
    """Scaled pixel size: a multiple of 32, at least 32 (sign kept)."""
    sign = -1 if value < 0 else 1
    return sign * max(32, int(round(abs(value) / 32.0)) * 32)


def _scale_value(value: Any, factor: float) -> Any:
    if _is_number(value) and abs(value) >= 32:
        return _round_size(value * factor)
    if isinstance(value, (list, tuple)):
        return type(value)(_scale_value(v, factor) for v in value)
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _resize_sides(cfg: Any, keys: Sequence[str]) -> List[float]:
    """The long side of every size under ``keys`` anywhere in ``cfg``: a
    number, a ``(w, h)`` pair, or a list of pairs (one per choice)."""
    found: List[float] = []
    if isinstance(cfg, dict):
        for key, value in cfg.items():
            if key not in keys:
                found += _resize_sides(value, keys)
            elif _is_number(value):
                found.append(abs(value))
            elif isinstance(value, (list, tuple)) and value:
                pairs = (
                    value if isinstance(value[0], (list, tuple)) else [value]
                )
                found += [
                    max(abs(v) for v in pair)
                    for pair in pairs
                    if pair and all(_is_number(v) for v in pair)
                ]
    elif isinstance(cfg, (list, tuple)):
        for value in cfg:
            found += _resize_sides(value, keys)
    return [v for v in found if v >= 32]


def _scale_sizes(
    cfg: Any, factor: float, path: str, keys: Sequence[str] = SIZE_KEYS
) -> List[str]:
    done: List[str] = []
    if isinstance(cfg, dict):
        for key, value in cfg.items():
            if key in keys:
                new = _scale_value(value, factor)
                if new != value:
                    cfg[key] = new
                    done.append(f'{path}.{key}: {value} -> {new}')
            else:
                done += _scale_sizes(value, factor, f'{path}.{key}', keys)
    elif isinstance(cfg, (list, tuple)):
        for i, value in enumerate(cfg):
            done += _scale_sizes(value, factor, f'{path}[{i}]', keys)
    return done


def scale_image_sizes(
    pipelines: Sequence[list],
    model: Optional[Dict[str, Any]],
    target: int,
) -> List[str]:
    """Scale every image size of the pipelines and of the model: its data
    preprocessor's, and a backbone's ``img_size`` (the position grid of a
    ViT or BEiT).

    The factor makes the long side of the smallest resize target
    (``scale``, ``img_scale``, ``scales``; else of ``crop_size``) ``target``
    pixels (the smallest: a ``(400, 4200)`` choice beside ``(800, 1333)``
    bounds the short side only, and a ``(1280, 1280)`` large-scale jitter
    beside a ``(640, 640)`` mosaic is twice the training size); every
    size under :data:`SIZE_KEYS` is multiplied by it and rounded to a
    multiple of 32. Sizes never grow (factor at most 1).

    Args:
        pipelines (list[list]): The training pipelines, changed in place.
        model (dict, optional): The model config, changed in place.
        target (int): Longest side, in pixels, of the scaled resize target.

    Returns:
        list[str]: What was changed.
    """
    sides = _resize_sides(list(pipelines), RESIZE_KEYS) or _resize_sides(
        list(pipelines), ('crop_size',)
    )
    if not sides:
        return []
    factor = min(1.0, target / min(sides))
    if math.isclose(factor, 1.0):
        return []
    notes = [f'image sizes x{factor:.3f}']
    for i, pipeline in enumerate(pipelines):
        notes += _scale_sizes(pipeline, factor, f'pipeline[{i}]')
    model = model if isinstance(model, dict) else {}
    if isinstance(model.get('data_preprocessor'), dict):
        notes += _scale_sizes(
            model['data_preprocessor'], factor, 'model.data_preprocessor'
        )
    if isinstance(model.get('backbone'), dict):
        notes += _scale_sizes(
            model['backbone'], factor, 'model.backbone', ('img_size',)
        )
    return notes


def shrink_runtime(
    cfg: Any, work_dir: str, max_iters: int, batch_size: int = 2
) -> List[str]:
    """A few iterations, no validation or test, one checkpoint at the end.

    The train loop becomes an ``IterBasedTrainLoop`` of ``max_iters``
    iterations; parameter schedulers step per iteration; ``load_from`` and
    ``resume`` are cleared; batch ``batch_size`` with no worker processes;
    an ``AmpOptimWrapper`` (which mmengine builds only with a GPU) becomes
    an fp32 ``OptimWrapper``.

    Args:
        cfg (Config): The whole config, changed in place.
        work_dir (str): The run's work dir.
        max_iters (int): Training iterations.
        batch_size (int): Training batch size. Defaults to 2.

    Returns:
        list[str]: What was changed.
    """
    cfg.work_dir = work_dir
    cfg.experiment_name = f'zoo_{uuid.uuid4().hex[:8]}'
    cfg.train_cfg = dict(
        type='IterBasedTrainLoop', max_iters=max_iters, val_interval=10**9
    )
    for key in (
        'val_cfg',
        'val_dataloader',
        'val_evaluator',
        'test_cfg',
        'test_dataloader',
        'test_evaluator',
    ):
        cfg[key] = None
    hooks = cfg.get('default_hooks') or {}
    hooks['checkpoint'] = dict(
        type='CheckpointHook',
        interval=max_iters,
        by_epoch=False,
        max_keep_ckpts=-1,
    )
    if isinstance(hooks.get('logger'), dict):
        hooks['logger']['interval'] = 1
    if isinstance(hooks.get('visualization'), dict):
        hooks['visualization']['draw'] = False
    cfg.default_hooks = hooks
    log_processor = dict(cfg.get('log_processor') or {})
    log_processor.update(by_epoch=False, window_size=1)
    cfg.log_processor = log_processor
    schedulers = cfg.get('param_scheduler') or []
    if isinstance(schedulers, dict):
        schedulers = [schedulers]
    for scheduler in schedulers:
        scheduler['by_epoch'] = False
        scheduler.pop('convert_to_iter_based', None)
    cfg.param_scheduler = schedulers or None
    notes = []
    wrapper = cfg.get('optim_wrapper') or {}
    if _short_type(wrapper) == 'AmpOptimWrapper':
        # mmengine's AmpOptimWrapper refuses to build without a GPU
        wrapper['type'] = 'OptimWrapper'
        for key in ('loss_scale', 'dtype', 'use_fsdp'):
            wrapper.pop(key, None)
        notes.append('optim_wrapper: AmpOptimWrapper -> OptimWrapper (fp32)')
    cfg.load_from = None
    cfg.resume = False
    cfg.randomness = dict(seed=0)
    loader = cfg.train_dataloader
    loader.update(batch_size=batch_size, num_workers=0)
    loader['persistent_workers'] = False
    return notes + [
        f'IterBasedTrainLoop(max_iters={max_iters}), no val/test, '
        f'batch {batch_size}, num_workers=0, load_from=None'
    ]
