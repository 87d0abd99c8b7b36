# Copyright (c) mmnanguard contributors. All rights reserved.
"""Smoke test of ``benchmarks/fault_matrix.py``: a few cells, in-process.

Each cell trains the tiny rotated RetinaNet for 3 iterations with a NaN
gradient planted at iteration 1 (a finite loss whose gradient is NaN) and
writes a checkpoint after every iteration. The values are checked against
what must happen: without protection ``clip_grad`` spreads the NaN into
every weight and every checkpoint written after it, and nothing says so;
mmdet's ``CheckInvalidLossHook`` looks at the loss only and raises one
iteration late, after the poisoned step reached the disk;
``NanGuardHook(policy='skip')`` drops exactly that step.
"""

import os.path as osp
import sys

import pytest
import torch

BENCHMARKS = osp.join(
    osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))), 'benchmarks'
)
sys.path.insert(0, BENCHMARKS)

from fault_matrix import format_grid, format_table  # noqa: E402
from fault_matrix_cell import run_cell  # noqa: E402

MAX_ITERS = 3
FAULT_ITER = 1


def _cell(tmp_path, data_root, mode):
    work_dir = str(tmp_path / mode)
    return run_cell(
        'dota',
        'nan_grad',
        mode,
        work_dir=work_dir,
        data_root=data_root,
        max_iters=MAX_ITERS,
        fault_iter=FAULT_ITER,
        ckpt_interval=1,
    )


@pytest.mark.slow
def test_bare_nan_grad_is_silent_and_ruins_the_weights(
    tmp_path, tiny_dota_root
):
    cell = _cell(tmp_path, tiny_dota_root, 'bare')
    assert cell['fault_iter'] == FAULT_ITER
    assert cell['detected'] is False
    assert cell['reached_max_iters'] is True
    assert cell['weights_finite'] is False
    # iter_1.pth is written before the fault, the others after it
    assert cell['checkpoints'] == {
        'iter_1.pth': True,
        'iter_2.pth': False,
        'iter_3.pth': False,
    }
    assert cell['checkpoints_finite'] is False
    assert cell['outcome'] == 'ruined'
    # the loss of the fault iteration is finite, the next one is not
    assert cell['nonfinite_loss_iters'][0] == FAULT_ITER + 1


@pytest.mark.slow
def test_check_invalid_loss_misses_a_nan_gradient(tmp_path, tiny_dota_root):
    cell = _cell(tmp_path, tiny_dota_root, 'check_invalid_loss')
    # it raises only at the next iteration, whose loss is NaN: after the
    # poisoned step was taken
    assert cell['detected'] is True
    assert cell['detector'] == 'CheckInvalidLossHook'
    assert cell['detect_delta'] == 1
    assert cell['weights_finite'] is False
    # the poisoned step of iteration 1 reached iter_2.pth before that
    assert cell['checkpoints'] == {'iter_1.pth': True, 'iter_2.pth': False}
    assert cell['reached_max_iters'] is False
    assert cell['error'].startswith('AssertionError')
    assert cell['outcome'] == 'detected_poisoned'


@pytest.mark.slow
def test_guard_skip_drops_the_step(tmp_path, tiny_dota_root):
    cell = _cell(tmp_path, tiny_dota_root, 'guard_skip')
    assert cell['detected'] is True
    assert cell['detect_iter'] == FAULT_ITER
    assert cell['detect_delta'] == 0
    assert cell['detector'] == 'NanGuardHook (nonfinite_grad)'
    assert cell['weights_finite'] is True
    assert cell['checkpoints_finite'] is True
    assert len(cell['checkpoints']) == MAX_ITERS
    assert cell['reached_max_iters'] is True
    assert cell['error'] is None
    assert [i['kind'] for i in cell['incidents']] == ['nonfinite_grad']
    assert cell['incidents'][0]['action'] == 'skip'
    assert cell['counters']['skipped'] == 1
    assert cell['outcome'] == 'recovered'
    assert cell['nonfinite_loss_iters'] == []
    text = format_table([cell])
    assert 'guard skip' in text and '+0 NanGuardHook' in text
    assert 'recovered (+0)' in format_grid([cell], 'dota')


def test_unknown_cell_is_refused(tmp_path, tiny_dota_root):
    with pytest.raises(ValueError, match='unknown cell'):
        run_cell(
            'dota',
            'nan_grad',
            'magic',
            work_dir=str(tmp_path),
            data_root=tiny_dota_root,
        )
    assert not torch.is_anomaly_enabled()
