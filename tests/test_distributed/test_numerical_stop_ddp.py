# Copyright (c) mmnanguard contributors. All rights reserved.
"""A numerical exception on bad data under ``torchrun`` (2 CPU processes,
gloo, ``tools/train.py --launcher pytorch``, the tiny rotated RetinaNet
with the include). The step cannot be dropped on one rank, so the run
stops; it stops promptly (no rank waits forever in the backward's
collective), and the rank that raised names the record first.

The exception is the one the data preprocessor of this test raises on a
box of width 0 (``torch.linalg.inv`` of a singular matrix, as mmrotate's
``GDLoss_v1`` does on such a box where its rounding reaches the loss:
``tests/test_engine/test_diagnosis/test_numerical_errors.py``)."""

import re
import time

import pytest
from integration_utils import NANGUARD_DOTA, TRAIN, run_script

from mmnanguard.datagen import generate_dota
from mmnanguard.testing.distributed import free_port, torchrun_args

PREPROCESSOR = '''
import torch
from mmdet.models import DetDataPreprocessor
from mmrotate.registry import MODELS


@MODELS.register_module()
class InvertsBoxCovariances(DetDataPreprocessor):
    """Inverts the covariance of every ground-truth box, as a Gaussian
    box loss does: a box of width 0 makes it singular."""

    def forward(self, data, training=False):
        data = super().forward(data, training)
        for sample in data['data_samples'] if training else []:
            boxes = sample.gt_instances.bboxes.tensor
            for w, h in boxes[:, 2:4].tolist():
                torch.linalg.inv(torch.diag(torch.tensor([w, h]) ** 2))
        return data
'''


@pytest.mark.slow
def test_the_rank_that_raised_names_the_record_and_the_run_stops(tmp_path):
    root = str(tmp_path / 'data')
    written = generate_dota(root, num_images=4, seed=0, broken=['zero_width'])
    (broken,) = written['broken']
    (tmp_path / 'inverts_box_covariances.py').write_text(PREPROCESSOR)
    config = tmp_path / 'cfg.py'
    config.write_text(
        f'_base_ = {NANGUARD_DOTA!r}\n'
        "custom_imports = dict(imports=['inverts_box_covariances'], "
        'allow_failed_imports=False)\n'
        "model = dict(data_preprocessor=dict(type='InvertsBoxCovariances'))\n"
    )
    started = time.monotonic()
    out = run_script(
        torchrun_args(2, free_port())
        + [
            TRAIN,
            str(config),
            '--launcher',
            'pytorch',
            '--work-dir',
            str(tmp_path / 'work'),
            '--cfg-options',
            'train_cfg.max_epochs=1',
            # 4 images, batch 2 on each of 2 ranks: one iteration
            f'train_dataloader.dataset.data_root={root}/',
        ],
        timeout=300,
        env=dict(OMP_NUM_THREADS='1', PYTHONPATH=str(tmp_path)),
    )
    assert time.monotonic() - started < 300
    log = out.stdout + out.stderr
    assert out.returncode != 0, log[-3000:]
    (named,) = re.findall(
        r'nanguard: LinAlgError: .* raised in the \w+ at iteration 0 on '
        r'rank (\d), on a batch whose data checks fail:\n(.*)\n',
        log,
    )
    rank, finding = named
    assert rank in ('0', '1')
    assert f"{broken['annfile'].split('/')[-1]} line {broken['line']}" in (
        finding
    ), finding
    assert 'rbox_size' in finding
    assert "dict(type='ValidateAnnotations', policy='filter')" in log
    assert 'LinAlgError' in log.split(named[1])[-1]  # then it is raised
