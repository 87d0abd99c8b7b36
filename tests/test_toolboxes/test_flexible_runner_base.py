# Copyright (c) mmnanguard contributors. All rights reserved.
"""An upstream config that sets ``runner_type`` itself, used as a base:
mmpretrain's MAE ViT-large fine-tuning under ``FlexibleRunner`` with
``FSDPStrategy`` (``mae/benchmarks/vit-large-p16_8xb128-fsdp-...``).

With the include ``nanguard.py`` mmengine refuses the config (two bases
set ``runner_type``); ``tools/train.py`` says so in one paragraph with the
fix. With the settings-only twin ``nanguard_settings.py`` the config
loads; ``tools/train.py`` builds the protected counterpart by itself, and
the line ``runner_type = 'mmnanguard.NanGuardFlexibleRunner'`` of the
user's own file does it for the official scripts. That run, shrunk (the
backbone at DeiT-tiny's size, 32x32 images, no pretrained weights; one
CPU process, so the strategy is ``SingleDeviceStrategy``: FSDP1 needs a
GPU), trains with a NaN gradient planted at iteration 1 and passes every
check of the toolbox runs."""

import os
import os.path as osp
import subprocess
import sys

import pytest
from mmengine.config import Config
from mmengine.registry import RUNNERS
from stack_marks import needs_mmpretrain
from test_mmpretrain import use_image_folder
from toolbox_runs import check_protected_run, train_protected, upstream_config

from mmnanguard.config_loading import (
    IncludeCollisionError,
    load_training_config,
)
from mmnanguard.engine.hooks import NanGuardHook
from mmnanguard.engine.runner import NanGuardFlexibleRunner
from mmnanguard.engine.runner import train_options as opts

pytestmark = [pytest.mark.stack_smoke, needs_mmpretrain]

FSDP_CONFIG = 'mae/benchmarks/vit-large-p16_8xb128-fsdp-coslr-50e_in1k.py'
REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
OWN_RUNNER_LINE = "runner_type = 'mmnanguard.NanGuardFlexibleRunner'\n"


def user_config(tmp_path, include: str, own_lines: str = '') -> str:
    path = tmp_path / 'user_config.py'
    upstream = upstream_config('mmpretrain', FSDP_CONFIG)
    path.write_text(f'_base_ = [{upstream!r}, {include!r}]\n{own_lines}')
    return str(path)


def test_the_upstream_config_sets_runner_type_itself():
    cfg = Config.fromfile(upstream_config('mmpretrain', FSDP_CONFIG))
    assert cfg.runner_type == 'FlexibleRunner'
    assert cfg.strategy.type == 'FSDPStrategy'


def test_include_collision_is_one_paragraph_with_the_fix(tmp_path):
    path = user_config(tmp_path, 'mmnanguard::_base_/nanguard.py')
    with pytest.raises(IncludeCollisionError) as err:
        load_training_config(path)
    assert 'nanguard_settings.py' in str(err.value)
    assert path in str(err.value)
    proc = subprocess.run(
        [sys.executable, osp.join(REPO, 'tools', 'train.py'), path],
        capture_output=True,
        text=True,
        timeout=300,
        # the stack's setuptools warns about pkg_resources, imported by
        # mmengine; the paragraph is what is checked
        env=dict(os.environ, PYTHONWARNINGS='ignore::UserWarning'),
    )
    assert proc.returncode == 2, proc.stderr
    assert 'Traceback' not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and 'IncludeCollisionError' in lines[0], lines
    assert "'mmnanguard::_base_/nanguard_settings.py'" in lines[0]


@pytest.mark.parametrize('own_line', [False, True], ids=['tool', 'official'])
def test_settings_include_builds_the_protected_counterpart(tmp_path, own_line):
    path = user_config(
        tmp_path,
        'mmnanguard::_base_/nanguard_settings.py',
        OWN_RUNNER_LINE if own_line else '',
    )
    cfg = load_training_config(path)
    assert cfg.nanguard.policy == 'skip'
    if own_line:  # the official tools/train.py: RUNNERS.build(cfg)
        assert cfg.runner_type == opts.FLEXIBLE_RUNNER_TYPE
    else:  # mmnanguard's tools/train.py selects the counterpart
        assert cfg.runner_type == 'FlexibleRunner'
        note = opts.apply_guard_option(cfg, None)
        assert "runner_type='FlexibleRunner' replaced" in note
        assert cfg.runner_type == opts.FLEXIBLE_RUNNER_TYPE
    cfg.work_dir = str(tmp_path / 'work')
    runner = RUNNERS.build(cfg)
    assert type(runner) is NanGuardFlexibleRunner
    assert type(runner.strategy).__name__ == 'FSDPStrategy'
    assert sum(isinstance(h, NanGuardHook) for h in runner.hooks) == 1


def shrink_mae_finetune(cfg, folder):
    """ViT at DeiT-tiny's size on 32x32 images, from scratch, one CPU
    process (``SingleDeviceStrategy``), fp32."""
    backbone = cfg.model.backbone
    backbone.update(arch='deit-tiny', img_size=32, drop_path_rate=0.0)
    backbone.pop('init_cfg')  # a pretrained MAE checkpoint: none here
    cfg.model.head.in_channels = 192
    cfg.strategy = dict(type='SingleDeviceStrategy')
    cfg.optim_wrapper.type = 'OptimWrapper'  # AmpOptimWrapper needs a GPU
    warmup, decay = cfg.param_scheduler
    warmup.update(end=2, convert_to_iter_based=False)
    decay.update(begin=2, convert_to_iter_based=False)
    for transform in cfg.train_dataloader.dataset.pipeline:
        if transform['type'] == 'RandomResizedCrop':
            transform['scale'] = 32
    use_image_folder(cfg, folder)


def test_upstream_flexible_config_is_protected(tmp_path, tiny_image_folder):
    run = train_protected(
        tmp_path,
        upstream_config('mmpretrain', FSDP_CONFIG),
        lambda cfg: shrink_mae_finetune(cfg, tiny_image_folder),
        include='mmnanguard::_base_/nanguard_settings.py',
        own_lines=OWN_RUNNER_LINE,
    )
    assert type(run['runner']) is NanGuardFlexibleRunner
    report = check_protected_run(run)
    groups = run['runner'].optim_wrapper.optimizer.param_groups
    assert len(groups) > 1  # layer-wise lr decay: a group per layer
    assert len(report['history'][-1]['lrs']) == len(groups)
