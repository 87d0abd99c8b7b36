# Copyright (c) mmnanguard contributors. All rights reserved.
"""One cell of the zoo sweep: one upstream config, shrunk, trained
protected for a few iterations with a fault planted, and checked.

:func:`run_cell` loads the upstream config with
``mmnanguard::_base_/nanguard.py`` in its ``_base_`` list (as a user
would write it), shrinks it for the CPU (``mmnanguard.testing.shrink``:
ResNet-18 or the config's own backbone without pretrained weights, BN for
SyncBN, 256 px images, batch 2, no validation) and points it at a
generated data set of the package's kind. A ``FaultInjectionHook`` plants
an inf loss term or a NaN gradient at ``fault_iter``. Checked afterwards:

* the incident: the first incident report is of ``fault_iter`` and of the
  fault's kind (``nonfinite_loss`` / ``nonfinite_grad``);
* the step was skipped: no trainable parameter changed across
  ``fault_iter``, while some changed in another iteration (so that the
  comparison can see a step);
* the weights, the EMA weights (when the config has an ``EMAHook``) and
  every checkpoint on disk are finite;
* the wall time, and the error if the run failed, classified
  (:func:`classify_error`).

With ``include='none'`` the same shrunk config trains without the include
and without a fault: whether the upstream config runs on the CPU at all.
With ``include='safe_modules'`` it trains with
``mmnanguard::_base_/safe_modules.py`` instead (the include plus the
numerically safe drop-ins, some of which replace CUDA-only upstream
losses).

Run as a script, it writes the cell's result as JSON (``zoo.py`` runs each
cell in its own subprocess, with a timeout).
"""

import argparse
import glob
import json
import os
import os.path as osp
import re
import sys
import time
import traceback
from typing import Any, Dict, List, Optional

import torch
from mmengine.hooks import Hook

#: Planted faults -> the incident kind that must report them.
FAULT_KINDS = dict(inf_loss='nonfinite_loss', nan_grad='nonfinite_grad')
#: Package -> longest side of the scaled resize target, in pixels.
TARGET_SIDE = dict(mmdet=256, mmrotate=256, mmseg=512)
#: ``--include`` choices -> the include's config path (``none``: bare).
INCLUDES = dict(
    nanguard='mmnanguard::_base_/nanguard.py',
    safe_modules='mmnanguard::_base_/safe_modules.py',
    none=None,
)
#: Messages of failures that say why a config cannot run here.
_CPU_KERNEL = re.compile(r'(\w+): implementation for device cpu not found')
_CUDA_ONLY = (
    'Torch not compiled with CUDA enabled',
    'Found no NVIDIA driver',
    'No CUDA GPUs are available',
    'CUDA driver',
)
_DOWNLOAD = (
    'urlopen error',
    'HTTPError',
    'Max retries exceeded',
    'Temporary failure in name resolution',
    'Connection refused',
    'huggingface',
    'We couldn',
)


class UnsupportedData(Exception):
    """The config needs data that the generators cannot produce."""


class NotAModel(Exception):
    """The config defines no model to train (a base of settings)."""


class WeightProbe(Hook):
    """Per iteration: how many trainable parameters the iteration changed
    (exact comparison with a copy taken before it). Observes only."""

    priority = 'LOWEST'

    def __init__(self) -> None:
        self.changed: Dict[int, int] = {}
        self._before: Dict[str, torch.Tensor] = {}

    @staticmethod
    def _params(runner) -> Dict[str, torch.Tensor]:
        from mmnanguard.engine.guard.snapshot import unwrap_model

        return {
            name: param.detach()
            for name, param in unwrap_model(runner.model).named_parameters()
            if param.requires_grad
        }

    def before_train_iter(
        self, runner, batch_idx: int, data_batch=None
    ) -> None:
        self._before = {k: v.clone() for k, v in self._params(runner).items()}

    def after_train_iter(
        self, runner, batch_idx: int, data_batch=None, outputs=None
    ) -> None:
        after = self._params(runner)
        self.changed[runner.iter] = sum(
            not torch.equal(self._before[k], v) for k, v in after.items()
        )


def config_package(config: str) -> str:
    """``'mmdet'`` for ``'mmdet::faster_rcnn/x.py'``.

    Raises:
        ValueError: ``config`` has no ``mmdet::``, ``mmrotate::`` or
            ``mmseg::`` scope.
    """
    package = config.partition('::')[0]
    if '::' not in config or package not in TARGET_SIDE:
        raise ValueError(
            f'config {config!r} is invalid; expected an upstream config '
            "path such as 'mmdet::faster_rcnn/"
            "faster-rcnn_r50_fpn_1x_coco.py' (scopes: "
            f'{tuple(TARGET_SIDE)})'
        )
    return package


def base_path(config: str) -> str:
    """How a ``_base_`` list names an upstream config: ``'mmdet::...'``,
    or its file path where mmengine cannot parse the scoped form (its
    pattern ``\\w*::\\w*/`` refuses a folder such as ``gn+ws``)."""
    if re.match(r'\w*::\w*/\w*', config):
        return config
    from zoo_families import config_root

    package, _, rel = config.partition('::')
    return osp.join(config_root(package), rel)


def load_with_include(
    config: str, work_dir: str, include: Optional[str] = 'nanguard'
):
    """Load ``config`` the way a user includes the guard: a config file
    whose ``_base_`` lists the upstream config and the include.

    Args:
        config (str): Upstream config, ``'mmdet::...'``.
        work_dir (str): Where the two-line config file is written.
        include (str, optional): A key of :data:`INCLUDES`; ``'none'`` or
            None loads the upstream config alone.

    Returns:
        Config: The loaded config.
    """
    from mmengine.config import Config

    import mmnanguard  # noqa: F401  (mends: mmnanguard:: paths, mmrotate)

    path = INCLUDES.get(include or 'none', False)
    if path is False:
        raise ValueError(
            f'include={include!r} is invalid; allowed values are '
            f'{tuple(INCLUDES)}'
        )
    bases = [base_path(config)] + ([] if path is None else [path])
    os.makedirs(work_dir, exist_ok=True)
    file_path = osp.join(work_dir, 'zoo_config.py')
    with open(file_path, 'w') as f:
        f.write(f'_base_ = {bases!r}\n')
    return Config.fromfile(file_path)


def data_root_for(data_dir: str, kind: str, num_classes: Optional[int]) -> str:
    """The generated data set of ``kind`` for a model of ``num_classes``
    classes under ``data_dir`` (generated on first use)."""
    from shrink_data import generate_data

    key = 'all' if kind != 'dota' or num_classes is None else num_classes
    root = osp.join(data_dir, f'{kind}_{key}')
    done = osp.join(root, '.generated')
    if not osp.exists(done):
        generate_data(kind, root, num_classes)
        open(done, 'w').close()
    return root


def build_cell_config(
    config: str,
    work_dir: str,
    data_dir: str,
    fault: Optional[str],
    max_iters: int,
    fault_iter: int,
    include: Optional[str] = 'nanguard',
    img_side: Optional[int] = None,
):
    """The cell's config: upstream + include, shrunk, generated data, the
    planted fault.

    Returns:
        tuple: ``(cfg, notes)``, notes saying what the shrink changed.

    Raises:
        UnsupportedData: The config needs data that cannot be generated.
        NotAModel: The config has no model or no training data loader.
    """
    from shrink_data import (
        PACKAGE_DATA,
        dataset_pipelines,
        model_num_classes,
        switch_dataset,
        unsupported_data,
    )

    from mmnanguard.testing.shrink import (
        scale_image_sizes,
        shrink_model,
        shrink_runtime,
    )

    package = config_package(config)
    cfg = load_with_include(config, work_dir, include)
    if not isinstance(cfg.get('model'), dict) or not cfg.get(
        'train_dataloader'
    ):
        raise NotAModel(
            'no model or no train_dataloader: a base of data / schedule '
            'settings for other configs'
        )
    needs = unsupported_data(cfg.train_dataloader.get('dataset'))
    if needs is not None:
        raise UnsupportedData(f'needs {needs}')
    notes = shrink_model(cfg.model)
    notes += shrink_runtime(cfg, work_dir, max_iters)
    kind = PACKAGE_DATA[package]
    num_classes = model_num_classes(cfg.model)
    root = data_root_for(data_dir, kind, num_classes)
    notes += switch_dataset(cfg, kind, root, num_classes)
    notes += scale_image_sizes(
        dataset_pipelines(cfg.train_dataloader.dataset),
        cfg.model,
        img_side or TARGET_SIDE[package],
    )
    if fault is not None:
        hooks = list(cfg.get('custom_hooks') or [])
        # LOWEST: the planted hooks are still in place when the guard's
        # diagnosis replays the batch (as in the fault matrix)
        hooks.append(
            dict(
                type='FaultInjectionHook',
                fault=fault,
                iteration=fault_iter,
                priority='LOWEST',
            )
        )
        cfg.custom_hooks = hooks
    return cfg, notes


def _frames(error: BaseException) -> List[str]:
    return [
        f'{f.filename}:{f.lineno} {f.name}'
        for f in traceback.extract_tb(error.__traceback__)
    ]


def _module_of(frame: str) -> str:
    path = frame.split(':')[0]
    for package in ('mmnanguard', 'mmdet', 'mmrotate', 'mmseg', 'mmcv'):
        if f'/{package}/' in path:
            return package
    if '/mmengine/' in path:
        return 'mmengine'
    if '/torch/' in path:
        return 'torch'
    return 'other'


def classify_error(message: str, frames: List[str]) -> Dict[str, str]:
    """Why a cell failed, from its error message and traceback frames.

    Args:
        message (str): ``'ErrorType: message'``.
        frames (list[str]): ``'file:line function'``, outermost first.

    Returns:
        dict: ``category`` (``cpu_kernel``, ``cuda_only``,
        ``missing_dependency``, ``download``, ``nanguard`` (raised in
        mmnanguard's code or naming it), ``upstream`` (raised elsewhere))
        and ``detail`` (the op, the module, the innermost frame).
    """
    kernel = _CPU_KERNEL.search(message)
    if kernel:
        op = re.sub(r'(_forward|_backward)?_impl$', '', kernel.group(1))
        return dict(category='cpu_kernel', detail=op)
    innermost = frames[-1] if frames else '?'
    if any(text in message for text in _CUDA_ONLY):
        return dict(category='cuda_only', detail=innermost)
    missing = re.search(
        r"No module named '([\w.]+)'|(\w[\w.-]*) is not installed", message
    )
    if missing or message.startswith(('ModuleNotFoundError', 'ImportError')):
        detail = (missing.group(1) or missing.group(2)) if missing else message
        return dict(category='missing_dependency', detail=detail[:200])
    if any(text in message for text in _DOWNLOAD):
        return dict(category='download', detail=message[:200])
    ours = [f for f in frames if _module_of(f) == 'mmnanguard']
    if (ours and ours[-1] == innermost) or 'nanguard' in message.lower():
        return dict(category='nanguard', detail=ours[-1] if ours else '')
    upstream = [f for f in frames if _module_of(f) != 'other']
    return dict(
        category='upstream', detail=upstream[-1] if upstream else innermost
    )


def _checkpoints(work_dir: str) -> Dict[str, bool]:
    """Every checkpoint of the run -> model, optimizer and EMA state all
    finite."""
    from mmnanguard.testing import tensors_all_finite

    out = {}
    for path in sorted(glob.glob(osp.join(work_dir, '*.pth'))):
        # the run's own file: full unpickling is safe here
        ckpt = torch.load(path, map_location='cpu', weights_only=False)
        out[osp.basename(path)] = tensors_all_finite(
            {
                key: ckpt.get(key)
                for key in ('state_dict', 'optimizer', 'ema_state_dict')
            }
        )
    return out


def _incidents(work_dir: str) -> List[Dict[str, Any]]:
    found = []
    pattern = osp.join(work_dir, 'nanguard', '*', 'report.json')
    for path in sorted(glob.glob(pattern)):
        with open(path) as f:
            report = json.load(f)
        found.append(
            dict(
                iteration=report['iteration'],
                kind=report['kind'],
                action=report['action'],
                cause=report.get('cause'),
            )
        )
    return found


def _model_facts(runner) -> Dict[str, Any]:
    """What was built: backbone type and depth, SyncBN left, EMA."""
    from mmengine.hooks import EMAHook

    from mmnanguard.engine.guard.snapshot import unwrap_model

    model = unwrap_model(runner.model)
    backbone = getattr(model, 'backbone', None)
    sync = sum(isinstance(m, torch.nn.SyncBatchNorm) for m in model.modules())
    return dict(
        model=type(model).__name__,
        backbone=type(backbone).__name__ if backbone is not None else None,
        backbone_depth=getattr(backbone, 'depth', None),
        sync_bn_modules=sync,
        params_m=round(sum(p.numel() for p in model.parameters()) / 1e6, 2),
        ema=any(isinstance(h, EMAHook) for h in runner.hooks),
    )


def _checks(
    result: Dict[str, Any], fault: Optional[str], fault_iter: int
) -> Dict[str, Any]:
    """The pass/fail checks of a trained cell."""
    changed = result['changed_params']
    ckpts = result['checkpoints']
    checks = dict(
        reached_max_iters=result['final_iter'] == result['max_iters'],
        weights_finite=result['weights_finite'],
        ema_finite=result['ema_finite'] is not False,
        checkpoints_finite=bool(ckpts) and all(ckpts.values()),
    )
    if fault is not None:
        incidents = result['incidents']
        checks['incident_in_fault_iter'] = bool(incidents) and (
            incidents[0]['iteration'] == fault_iter
            and incidents[0]['kind'] == FAULT_KINDS[fault]
        )
        checks['step_skipped'] = changed.get(fault_iter) == 0 and any(
            n > 0 for i, n in changed.items() if i != fault_iter
        )
    return checks


def run_cell(
    config: str,
    work_dir: str,
    data_dir: str,
    fault: Optional[str] = 'inf_loss',
    max_iters: int = 3,
    fault_iter: int = 1,
    include: Optional[str] = 'nanguard',
    img_side: Optional[int] = None,
) -> Dict[str, Any]:
    """Train one cell in this process.

    Args:
        config (str): Upstream config, e.g.
            ``'mmdet::faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py'``.
        work_dir (str): The run's work dir.
        data_dir (str): Folder of the generated data sets (shared by
            cells; each kind is generated on first use).
        fault (str, optional): ``'inf_loss'``, ``'nan_grad'`` or None.
        max_iters (int): Training iterations. Defaults to 3.
        fault_iter (int): Iteration the fault is planted in.
        include (str, optional): ``'nanguard'``, ``'safe_modules'``, or
            ``'none'`` / None: bare, without a fault.
        img_side (int, optional): Longest side of the scaled resize
            target; None: :data:`TARGET_SIDE` of the package.

    Returns:
        dict: ``status`` (``pass``, ``fail``, ``error``, ``no_data``,
        ``no_model``) and
        the values behind it (see the module docstring).

    Raises:
        ValueError: For an unknown ``fault`` or an unscoped ``config``.
    """
    from mmengine.hooks import EMAHook
    from mmengine.registry import RUNNERS
    from mmengine.runner import BaseLoop, Runner

    from mmnanguard.testing import tensors_all_finite

    if fault is not None and fault not in FAULT_KINDS:
        raise ValueError(
            f'fault={fault!r} is invalid; allowed values are '
            f'{tuple(FAULT_KINDS)} or None'
        )
    include = include or 'none'
    fault = fault if include != 'none' else None
    result: Dict[str, Any] = dict(
        config=config,
        package=config_package(config),
        include=include,
        fault=fault,
        fault_iter=fault_iter if fault else None,
        max_iters=max_iters,
    )
    start = time.perf_counter()
    runner, stage = None, 'load'
    try:
        cfg, notes = build_cell_config(
            config,
            work_dir,
            data_dir,
            fault,
            max_iters,
            fault_iter,
            include,
            img_side,
        )
        result['shrink'] = notes
        stage = 'build'
        if cfg.get('runner_type'):
            runner = RUNNERS.build(cfg)
        else:
            runner = Runner.from_cfg(cfg)
        probe = WeightProbe()
        runner.register_hook(probe)
        stage = 'train'
        runner.train()
    except (UnsupportedData, NotAModel) as err:
        status = 'no_data' if isinstance(err, UnsupportedData) else 'no_model'
        result.update(status=status, reason=str(err))
        result['wall_s'] = round(time.perf_counter() - start, 1)
        return result
    except Exception as err:  # a cell's failure is its result
        message = f'{type(err).__name__}: {err}'.strip()
        result.update(
            status='error',
            stage=stage,
            error=message[:1500],
            frames=_frames(err)[-12:],
        )
        result.update(classify_error(message, _frames(err)))
    result['wall_s'] = round(time.perf_counter() - start, 1)
    if runner is None or result.get('stage') == 'build':
        return result
    ema = next((h for h in runner.hooks if isinstance(h, EMAHook)), None)
    # runner.iter builds the train loop if train() failed before it did
    loop = getattr(runner, '_train_loop', None)
    result.update(
        _model_facts(runner),
        final_iter=loop.iter if isinstance(loop, BaseLoop) else 0,
        changed_params=probe.changed,
        incidents=_incidents(work_dir),
        weights_finite=tensors_all_finite(runner.model.state_dict()),
        ema_finite=None
        if ema is None
        else tensors_all_finite(ema.ema_model.state_dict()),
        checkpoints=_checkpoints(work_dir),
    )
    result['checks'] = _checks(result, fault, fault_iter)
    if result.get('status') != 'error':
        result['status'] = 'pass' if all(result['checks'].values()) else 'fail'
    return result


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('config', help="upstream config, 'mmdet::...'")
    parser.add_argument('--work-dir', required=True)
    parser.add_argument('--data-dir', required=True)
    parser.add_argument('--out', required=True, help='result JSON')
    parser.add_argument('--fault', default='inf_loss')
    parser.add_argument('--iters', type=int, default=3)
    parser.add_argument('--fault-iter', type=int, default=1)
    parser.add_argument('--include', choices=INCLUDES, default='nanguard')
    parser.add_argument('--img-side', type=int, help='resize target, px')
    args = parser.parse_args(argv)
    result = run_cell(
        args.config,
        args.work_dir,
        args.data_dir,
        fault=args.fault,
        max_iters=args.iters,
        fault_iter=args.fault_iter,
        include=args.include,
        img_side=args.img_side,
    )
    with open(args.out, 'w') as f:
        json.dump(result, f, indent=1, default=str)
    return 0


if __name__ == '__main__':
    sys.exit(main())
