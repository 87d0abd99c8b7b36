# Copyright (c) mmnanguard contributors. All rights reserved.
"""The real mmrotate and mmdet configs train on generated data, save a
checkpoint, and resume from it with the iteration and optimizer restored."""

import os.path as osp

import pytest
import torch
from mmengine.hooks import Hook
from mmengine.runner import Runner
from mmengine.runner.checkpoint import CheckpointLoader

from mmnanguard.testing import (
    TINY_COCO_CONFIG,
    TINY_DOTA_CONFIG,
    load_tiny_config,
    tensors_all_finite,
)


@pytest.mark.parametrize(
    'config, root',
    [
        (TINY_DOTA_CONFIG, 'tiny_dota_root'),
        (TINY_COCO_CONFIG, 'tiny_coco_root'),
    ],
)
@pytest.mark.slow
def test_train_save_resume(config, root, tmp_path, request):
    data_root = request.getfixturevalue(root)
    work_dir = str(tmp_path / 'work')
    # 1 epoch = 4 iterations (8 images, batch 2), checkpoint every epoch
    cfg = load_tiny_config(
        config, work_dir, data_root, train_cfg=dict(max_epochs=1)
    )
    runner = Runner.from_cfg(cfg)
    runner.train()
    ckpt_path = osp.join(work_dir, 'epoch_1.pth')
    assert osp.isfile(ckpt_path)
    assert runner.iter == 4
    saved = CheckpointLoader.load_checkpoint(ckpt_path)  # the allowlist
    assert saved['meta']['iter'] == 4 and saved['meta']['epoch'] == 1
    assert tensors_all_finite(saved['state_dict'])
    assert saved['optimizer']['state'], 'SGD momentum was saved'

    cfg = load_tiny_config(
        config, work_dir, data_root, train_cfg=dict(max_epochs=2), resume=True
    )
    resumed = Runner.from_cfg(cfg)
    seen = {}

    class RestoredStateProbe(Hook):
        def before_train(self, runner):
            seen['iter'], seen['epoch'] = runner.iter, runner.epoch
            optimizer = runner.optim_wrapper.optimizer
            group = optimizer.param_groups[0]['params']
            saved_state = saved['optimizer']['state']
            for index in list(saved_state)[:5]:
                torch.testing.assert_close(
                    optimizer.state[group[index]]['momentum_buffer'],
                    saved_state[index]['momentum_buffer'],
                )
            params = dict(runner.model.named_parameters())
            name = 'backbone.layer1.0.conv1.weight'
            torch.testing.assert_close(
                params[name].detach(), saved['state_dict'][name]
            )
            seen['checked'] = True

    resumed.register_hook(RestoredStateProbe(), priority='LOWEST')
    resumed.train()
    assert seen == dict(iter=4, epoch=1, checked=True)
    assert resumed.iter == 8
    assert osp.isfile(osp.join(work_dir, 'epoch_2.pth'))
