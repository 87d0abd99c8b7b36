# Copyright (c) mmnanguard contributors. All rights reserved.
"""Train a toolbox's upstream config, shrunk for the CPU, through the
include with a NaN gradient planted at iteration 1, and check what the
guard did and what its incident report says against what the run did
(recorded by hooks that read the runner, not the guard)."""

import glob
import json
import os.path as osp
from importlib import import_module
from typing import Any, Callable, Dict, List, Optional

import pytest
import torch
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.registry import RUNNERS

from mmnanguard.engine.hooks import NanGuardHook
from mmnanguard.testing import tensors_all_finite
from mmnanguard.testing.shrink import shrink_runtime

#: The iteration the NaN gradient is planted in.
FAULT_ITER = 1
#: Iterations trained: the fault and one clean step after it.
MAX_ITERS = 3
BATCH = 2


def load_tool(name: str) -> Any:
    """The module of the installed ``tools/NAME.py`` (its ``main(argv)``
    is what the command line runs)."""
    import importlib.util

    from mmnanguard import cli

    spec = importlib.util.spec_from_file_location(name, cli.tool_path(name))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def upstream_config(package: str, relative: str) -> str:
    """A config of the installed toolbox's model zoo (``.mim/configs``)."""
    root = osp.dirname(import_module(package).__file__)
    path = osp.join(root, '.mim', 'configs', relative)
    assert osp.isfile(path), path
    return path


class RunRecorder(Hook):
    """The parameters before training (``initial``) and after every
    iteration (``params``) and the live lr of every param group when the
    step runs, read off the runner's optimizer."""

    priority = 'LOWEST'

    def __init__(self) -> None:
        self.initial: Dict[str, torch.Tensor] = {}
        self.params: List[Dict[str, torch.Tensor]] = []
        self.lrs: Dict[int, List[float]] = {}

    def before_train(self, runner):
        self.initial = {
            name: p.detach().clone()
            for name, p in runner.model.named_parameters()
        }

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        # LOWEST: after the param scheduler hooks set this step's lr
        self.lrs[runner.iter] = [
            float(group['lr'])
            for group in runner.optim_wrapper.optimizer.param_groups
        ]

    def after_train_iter(
        self, runner, batch_idx, data_batch=None, outputs=None
    ):
        self.params.append(
            {
                name: p.detach().clone()
                for name, p in runner.model.named_parameters()
            }
        )


def train_protected(
    tmp_path: Any,
    upstream: str,
    shrink: Callable[[Config], None],
    include: Optional[str] = 'mmnanguard::_base_/nanguard.py',
    own_lines: str = '',
    fault: Optional[str] = 'nan_grad',
    path_key: str = 'img_path',
) -> Dict[str, Any]:
    """Train ``upstream`` + the include, shrunk by ``shrink`` and
    :func:`shrink_runtime`, with ``fault`` planted at :data:`FAULT_ITER`.

    Args:
        tmp_path: The work dir.
        upstream (str): The upstream config file.
        shrink (callable): Shrinks the loaded config in place.
        include (str, optional): The include listed after ``upstream``;
            None: the upstream config alone, unguarded.
        own_lines (str): Lines of the user's config after ``_base_``.
        fault (str, optional): The ``FaultInjectionHook`` fault planted;
            None: nothing planted (a fault of the data or the model).
        path_key (str): The data info field that names a sample's file
            (mmaction2's videos: ``filename``).

    Returns:
        dict: ``runner``, ``recorder`` (:class:`RunRecorder`), ``reports``
        (every ``report.json``), ``checkpoint`` (the last one, loaded) and
        ``batch_files`` (the image files of the planted iteration's batch,
        from the sampler's order and the dataset).
    """
    work_dir = str(tmp_path)
    path = tmp_path / 'user_config.py'
    bases = [upstream] if include is None else [upstream, include]
    path.write_text(f'_base_ = {bases!r}\n{own_lines}')
    cfg = Config.fromfile(str(path))
    shrink(cfg)
    shrink_runtime(cfg, work_dir, max_iters=MAX_ITERS, batch_size=BATCH)
    if fault is not None:
        cfg.custom_hooks = list(cfg.get('custom_hooks') or []) + [
            dict(type='FaultInjectionHook', fault=fault, iteration=FAULT_ITER)
        ]
    runner = RUNNERS.build(cfg)
    recorder = RunRecorder()
    runner.register_hook(recorder)
    runner.train()
    reports = []
    for report_path in sorted(
        glob.glob(osp.join(work_dir, 'nanguard', '*', 'report.json'))
    ):
        with open(report_path) as f:
            report = json.load(f)
        report['folder'] = osp.dirname(report_path)
        reports.append(report)
    checkpoint = torch.load(
        osp.join(work_dir, f'iter_{MAX_ITERS}.pth'),
        map_location='cpu',
        weights_only=False,
    )
    loader = runner.train_dataloader
    order = list(iter(loader.sampler))  # the epoch-0 order of the run
    first = FAULT_ITER * BATCH
    batch_files = [
        loader.dataset.get_data_info(i)[path_key]
        for i in order[first : first + BATCH]
    ]
    return dict(
        runner=runner,
        recorder=recorder,
        reports=reports,
        checkpoint=checkpoint,
        batch_files=batch_files,
    )


def first_trainable_parameter(model: torch.nn.Module) -> str:
    """The parameter ``FaultInjectionHook(fault='nan_grad')`` poisons: the
    model's first trainable one."""
    return next(n for n, p in model.named_parameters() if p.requires_grad)


def check_protected_run(run: Dict[str, Any]) -> Dict[str, Any]:
    """The checks every toolbox run must pass; returns its one report.

    * one incident, in the planted iteration, a non-finite gradient,
      skipped: the parameters after it are those before it;
    * the weights, the optimizer state, the checkpoint (with an EMA's
      state, where the config has one) are finite;
    * the report names the batch's image files and the poisoned parameter;
    * the live lr of every param group in the report's history is the
      optimizer's, as the run set it;
    * the replay ran on the toolbox's model and batch and tells the
      planted fault apart: a one-shot fault of the backward pass.
    """
    runner, recorder = run['runner'], run['recorder']
    guard = next(h for h in runner.hooks if isinstance(h, NanGuardHook))
    assert guard.counters['incidents'] == 1
    assert guard.counters['skipped'] == 1
    (report,) = run['reports']
    assert report['iteration'] == FAULT_ITER
    assert report['action'] == 'skip'
    assert report['kind'] == 'nonfinite_grad'
    # the skipped step left every parameter as it was
    before, after = (
        recorder.params[FAULT_ITER - 1],
        recorder.params[FAULT_ITER],
    )
    assert before.keys() == after.keys()
    for name in before:
        assert torch.equal(before[name], after[name]), name
    assert all(torch.isfinite(p).all() for p in recorder.params[-1].values())
    checkpoint = run['checkpoint']
    assert tensors_all_finite(checkpoint['state_dict'])
    assert tensors_all_finite(checkpoint['optimizer'])
    assert tensors_all_finite(checkpoint.get('ema_state_dict', {}))
    assert checkpoint['nanguard']['counters']['skipped'] == 1
    # the report names the batch's files and the poisoned parameter
    files = [s['img_path'] for s in report['samples']]
    assert files == run['batch_files']
    poisoned = first_trainable_parameter(runner.model)
    assert report['top_grad_params'][0]['name'] == poisoned
    assert report['top_grad_params'][0]['grad_norm'] == 'nan'
    # the live lr of every group, iteration by iteration
    for entry in report['history']:
        live = recorder.lrs[entry['iteration']]
        assert entry['lrs'] == pytest.approx(live, rel=1e-12), entry
        assert any(
            entry['lr'] == pytest.approx(lr, rel=1e-12) for lr in live
        ), entry
    # the replay: the same model and batch without the planted hook
    assert 'diagnosis_error' not in report, report.get('diagnosis_error')
    assert report['reproduced'] is False
    assert report['cause'] == 'transient'
    assert report['stage'] == 'backward'
    return report
