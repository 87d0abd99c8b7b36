# Copyright (c) mmnanguard contributors. All rights reserved.
"""mmseg FCN on generated Cityscapes with the include: label 255 without an
``ignore_index`` stops training with a message naming 255 and the fix; with
``ignore_index=255`` the same config trains."""

import numpy as np
import pytest
from integration_utils import NANGUARD_CITYSCAPES, TRAIN, run_script
from mmengine.hooks import Hook
from mmengine.registry import RUNNERS

from mmnanguard.models.losses import CheckedCrossEntropyLoss, InvalidLabelError
from mmnanguard.testing import load_tiny_config


def _cfg(root, work_dir, ignore_index):
    return load_tiny_config(
        NANGUARD_CITYSCAPES,
        str(work_dir),
        root,
        max_iters=2,
        **{
            'model.decode_head.ignore_index': ignore_index,
            'model.auxiliary_head.ignore_index': ignore_index,
        },
    )


class FirstVoidBatch(Hook):
    """The first iteration whose batch (after the random crop) holds 255."""

    priority = 'HIGHEST'

    def __init__(self):
        self.iteration = None

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        voids = [
            bool((s.gt_sem_seg.data == 255).any())
            for s in data_batch['data_samples']
        ]
        if self.iteration is None and any(voids):
            self.iteration = runner.iter


def test_label_255_without_ignore_index_stops(tiny_cityscapes_root, tmp_path):
    # the generated label maps hold 255 (void) regions; a 128 px crop may
    # miss them
    runner = RUNNERS.build(_cfg(tiny_cityscapes_root, tmp_path, None))
    first_void = FirstVoidBatch()
    runner.register_hook(first_void)
    head = runner.model.decode_head
    assert isinstance(head.loss_decode, CheckedCrossEntropyLoss)
    assert head.loss_decode.impl == 'mmseg'
    with pytest.raises(InvalidLabelError) as err:
        runner.train()
    message = str(err.value)
    assert 'label value 255' in message
    assert 'ignore_index=255' in message
    # stopped in the first iteration whose batch holds 255, before its
    # update
    assert first_void.iteration is not None
    assert runner.iter == first_void.iteration


def test_ignore_index_255_trains(tiny_cityscapes_root, tmp_path):
    runner = RUNNERS.build(_cfg(tiny_cityscapes_root, tmp_path, 255))
    runner.train()
    assert runner.iter == 2
    losses, _ = runner.message_hub.get_scalar('train/decode.loss_ce').data
    # a fresh 19-class head: cross-entropy near log(19) = 2.94
    assert len(losses) == 2 and np.isfinite(losses).all()
    assert 0.3 * np.log(19) < losses[0] < 3 * np.log(19)


@pytest.mark.slow
def test_train_tool_stops_cleanly_on_255(tiny_cityscapes_root, tmp_path):
    out = run_script(
        [
            TRAIN,
            NANGUARD_CITYSCAPES,
            '--work-dir',
            str(tmp_path),
            '--cfg-options',
            f'train_dataloader.dataset.data_root={tiny_cityscapes_root}/',
            'train_cfg.max_iters=2',
            'model.decode_head.ignore_index=None',
            'model.auxiliary_head.ignore_index=None',
        ],
        timeout=300,
    )
    assert out.returncode == 3, out.stderr[-2000:]
    assert 'InvalidLabelError' in out.stderr
    assert 'label value 255' in out.stderr
    assert 'ignore_index=255' in out.stderr
    assert 'Traceback' not in out.stderr
