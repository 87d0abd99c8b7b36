# Copyright (c) mmnanguard contributors. All rights reserved.
"""``tools/train.py --launcher pytorch`` under ``torchrun`` with 2 CPU
processes (gloo), a fault planted on rank 1 only: both ranks take the same
action and finish."""

import glob
import json
import os.path as osp
import re

import pytest
from integration_utils import DEMO_CONFIG, TRAIN, run_script

from mmnanguard.testing.distributed import free_port, torchrun_args


@pytest.mark.slow
def test_fault_on_one_rank_same_action_on_both(tiny_dota_root, tmp_path):
    config = tmp_path / 'ddp_fault.py'
    config.write_text(
        f'_base_ = {DEMO_CONFIG!r}\n'
        "custom_hooks = [dict(type='FaultInjectionHook', fault='inf_loss',"
        ' iteration=1, rank=1)]\n'
    )
    work_dir = tmp_path / 'work'
    out = run_script(
        torchrun_args(2, free_port())
        + [
            TRAIN,
            str(config),
            '--launcher',
            'pytorch',
            '--work-dir',
            str(work_dir),
            '--cfg-options',
            'train_cfg.max_epochs=1',
            # 8 images, batch 2 on each of 2 ranks: 2 iterations
            f'train_dataloader.dataset.data_root={tiny_dota_root}/',
        ],
        timeout=300,
        env=dict(OMP_NUM_THREADS='1'),
    )
    assert out.returncode == 0, out.stderr[-4000:]
    log = out.stdout + out.stderr
    assert log.count('nanguard summary') >= 1
    reports = sorted(
        glob.glob(str(work_dir / 'nanguard' / '*' / 'report.json'))
    )
    by_rank = {}
    for path in reports:
        report = json.load(open(path))
        by_rank[report['rank']] = report
    assert sorted(by_rank) == [0, 1], reports
    for rank, report in by_rank.items():
        assert report['world_size'] == 2
        assert report['iteration'] == 1
        assert report['kind'] == 'nonfinite_loss'
        assert report['action'] == 'skip'
        # only rank 1 saw the fault itself
        assert report['local_fault'] is (rank == 1)
    # both ranks ran to the end: 2 iterations, a final checkpoint
    assert osp.isfile(str(work_dir / 'epoch_1.pth'))
    iters = re.findall(r'Epoch\(train\) \[1\]\[(\d)/2\]', log)
    assert '2' in iters
