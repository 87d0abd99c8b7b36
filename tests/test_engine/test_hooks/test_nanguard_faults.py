# Copyright (c) mmnanguard contributors. All rights reserved.
"""Fault injection on the real mmrotate rotated RetinaNet config.

For each fault and each policy: the fault is detected in the iteration it
happens, the parameters stay bit-identical through a skipped iteration, the
run completes under skip/rollback, it stops with a named error under raise,
and no checkpoint on disk holds a non-finite value.
"""

import glob
import json
import os.path as osp

import pytest
import torch
from mmengine.hooks import Hook
from mmengine.runner import Runner
from mmengine.runner.checkpoint import CheckpointLoader

from mmnanguard.engine import NonFiniteTrainingError
from mmnanguard.testing import (
    TINY_DOTA_CONFIG,
    load_tiny_config,
    tensors_all_finite,
)

MAX_ITERS = 5
FAULT_ITER = 2

# fault -> (first non-finite iteration, incident kind)
FAULTS = {
    'nan_pixel': (FAULT_ITER, 'nonfinite_loss'),
    'inf_loss': (FAULT_ITER, 'nonfinite_loss'),
    'nan_grad': (FAULT_ITER, 'nonfinite_grad'),
    # the spiked step itself is finite (clip_grad bounds it); the next
    # forward pass overflows
    'lr_spike': (FAULT_ITER + 1, None),
    'nan_optimizer_state': (FAULT_ITER, 'nonfinite_params'),
}


class ParamRecorder(Hook):
    """Copies the parameters before and after every iteration."""

    priority = 'LOWEST'

    def __init__(self):
        self.before, self.after = {}, {}

    def _copy(self, runner):
        return [p.detach().clone() for p in runner.model.parameters()]

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        self.before[runner.iter] = self._copy(runner)

    def after_train_iter(
        self, runner, batch_idx, data_batch=None, outputs=None
    ):
        self.after[runner.iter] = self._copy(runner)


def _run(tmp_path, data_root, fault, policy):
    work_dir = str(tmp_path / f'{fault}_{policy}')
    cfg = load_tiny_config(
        TINY_DOTA_CONFIG,
        work_dir,
        data_root,
        max_iters=MAX_ITERS,
        custom_hooks=[
            dict(type='FaultInjectionHook', fault=fault, iteration=FAULT_ITER),
            dict(
                type='NanGuardHook',
                policy=policy,
                snapshot_interval=1,
                max_consecutive_skips=1,
            ),
        ],
    )
    cfg.default_hooks.checkpoint = dict(
        type='CheckpointHook', interval=1, by_epoch=False, max_keep_ckpts=-1
    )
    runner = Runner.from_cfg(cfg)
    recorder = ParamRecorder()
    runner.register_hook(recorder)
    error = None
    try:
        runner.train()
    except NonFiniteTrainingError as err:
        error = err
    return runner, recorder, error, work_dir


def _guard(runner):
    return next(h for h in runner.hooks if type(h).__name__ == 'NanGuardHook')


def _reports(work_dir):
    paths = sorted(
        glob.glob(osp.join(work_dir, 'nanguard', '*', 'report.json'))
    )
    return [json.load(open(p)) for p in paths]


@pytest.mark.parametrize('policy', ['raise', 'skip', 'rollback'])
@pytest.mark.parametrize('fault', list(FAULTS))
def test_fault_under_policy(tmp_path, tiny_dota_root, fault, policy):
    runner, recorder, error, work_dir = _run(
        tmp_path, tiny_dota_root, fault, policy
    )
    first_bad, kind = FAULTS[fault]
    reports = _reports(work_dir)
    assert reports, 'an incident report was written'
    first = reports[0]
    assert first['iteration'] == first_bad
    if kind is not None:
        assert first['kind'] == kind
    assert osp.isfile(osp.join(osp.dirname(first['report_path']), 'batch.pth'))
    assert [s['img_path'] for s in first['samples']] and all(
        s['img_path'].endswith('.png') for s in first['samples']
    )
    if fault == 'inf_loss':
        assert 'loss_cls' in first['nonfinite_terms']
    if fault == 'nan_grad':
        assert first['grad_norm'] == 'nan'
        assert first['top_grad_params'][0]['grad_norm'] == 'nan'

    if policy == 'raise':
        assert error is not None
        message = str(error)
        assert f'iteration {first_bad}' in message
        assert first['report_path'] in message
        assert runner.iter == first_bad
    else:
        assert error is None
        assert runner.iter == MAX_ITERS
        assert _guard(runner).counters['incidents'] >= 1
    if policy == 'skip' and kind in ('nonfinite_loss', 'nonfinite_grad'):
        # a skipped iteration leaves every parameter bit-identical
        for before, after in zip(
            recorder.before[first_bad], recorder.after[first_bad]
        ):
            assert torch.equal(before, after)
    if policy == 'rollback' or first['action'] == 'rollback':
        assert _guard(runner).counters['rollbacks'] >= 1
    # the weights in memory are finite, whatever happened (under `raise`
    # after a step that made them non-finite: the last snapshot's)
    assert all(torch.isfinite(p).all() for p in runner.model.parameters())
    if policy == 'raise' and kind == 'nonfinite_params':
        assert 'weights in memory were restored to iteration' in str(error)
    ckpts = glob.glob(osp.join(work_dir, '*.pth'))
    assert ckpts, 'checkpoints were written'
    for path in ckpts:
        ckpt = CheckpointLoader.load_checkpoint(path)
        assert tensors_all_finite(ckpt['state_dict']), path
        assert tensors_all_finite(ckpt['optimizer']), path
