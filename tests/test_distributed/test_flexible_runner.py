# Copyright (c) mmnanguard contributors. All rights reserved.
"""Which protected runner a config builds (one process, nothing trained
except where said): the include under ``FlexibleRunner`` configs."""

import os
import os.path as osp
import subprocess
import sys

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import RUNNERS
from mmengine.runner import FlexibleRunner

from mmnanguard.config_loading import (
    SETTINGS_INCLUDE,
    IncludeCollisionError,
    load_training_config,
)
from mmnanguard.engine.guard.checkpoint_layout import model_state_for
from mmnanguard.engine.hooks import NanGuardHook
from mmnanguard.engine.runner import NanGuardFlexibleRunner, NanGuardRunner
from mmnanguard.engine.runner import train_options as opts
from mmnanguard.testing import TINY_COCO_CONFIG, load_tiny_config

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
INCLUDE = osp.join(REPO, 'configs', '_base_', 'nanguard.py')


def _write(tmp_path, body: str, include: bool = True) -> str:
    bases = [TINY_COCO_CONFIG] + ([INCLUDE] if include else [])
    path = tmp_path / 'cfg.py'
    path.write_text(f'_base_ = {bases!r}\n' + body)
    return str(path)


def _built(path: str, tmp_path, coco_root: str):
    cfg = load_tiny_config(path, str(tmp_path / 'work'), coco_root)
    return cfg, RUNNERS.build(cfg)


def test_strategy_key_builds_the_flexible_counterpart(
    tiny_coco_root, tmp_path
):
    path = _write(tmp_path, "strategy = dict(type='SingleDeviceStrategy')\n")
    cfg, runner = _built(path, tmp_path, tiny_coco_root)
    assert cfg.runner_type == 'mmnanguard.NanGuardRunner'  # the include's
    assert type(runner) is NanGuardFlexibleRunner
    assert isinstance(runner, FlexibleRunner)
    assert any(isinstance(h, NanGuardHook) for h in runner.hooks)
    # the optim wrapper config names the guarded counterpart
    assert runner.optim_wrapper['type'] == 'mmnanguard.GuardedOptimWrapper'


def test_no_strategy_builds_the_runner(tiny_coco_root, tmp_path):
    path = _write(tmp_path, '')
    _, runner = _built(path, tmp_path, tiny_coco_root)
    assert type(runner) is NanGuardRunner


def test_own_flexible_runner_type_gets_the_counterpart(
    tiny_coco_root, tmp_path
):
    """The config's own ``runner_type`` replaces the include's (no error
    from mmengine); ``tools/train.py`` selects the protected counterpart."""
    path = _write(
        tmp_path,
        "runner_type = 'FlexibleRunner'\n"
        "strategy = dict(type='SingleDeviceStrategy')\n",
    )
    cfg = Config.fromfile(path)
    assert cfg.runner_type == 'FlexibleRunner' and 'nanguard' in cfg
    note = opts.apply_guard_option(cfg, None)
    assert cfg.runner_type == opts.FLEXIBLE_RUNNER_TYPE
    assert "runner_type='FlexibleRunner'" in note
    cfg.work_dir = str(tmp_path / 'work')
    cfg.train_dataloader.dataset.data_root = tiny_coco_root + '/'
    assert type(RUNNERS.build(cfg)) is NanGuardFlexibleRunner


@pytest.mark.parametrize('runner_type', ['FlexibleRunner', None])
def test_guard_option_on_a_flexible_config_without_the_include(
    tmp_path, runner_type
):
    body = "strategy = dict(type='DDPStrategy')\n"
    if runner_type:
        body = f'runner_type = {runner_type!r}\n' + body
    cfg = Config.fromfile(_write(tmp_path, body, include=False))
    opts.apply_guard_option(cfg, 'rollback')
    assert cfg.runner_type == opts.FLEXIBLE_RUNNER_TYPE
    assert cfg.nanguard.policy == 'rollback'
    include = Config.fromfile(INCLUDE).nanguard
    assert cfg.nanguard == dict(include, policy='rollback')


def test_guard_option_still_refuses_a_runner_without_counterpart():
    cfg = Config(dict(runner_type='MyRunner', strategy=dict(type='X')))
    with pytest.raises(ValueError, match="runner_type='MyRunner'"):
        opts.apply_guard_option(cfg, 'skip')


SETTINGS = osp.join(REPO, 'configs', '_base_', 'nanguard_settings.py')


@pytest.mark.parametrize(
    'body, expected',
    [
        ('', opts.RUNNER_TYPE),
        ("strategy = dict(type='DDPStrategy')\n", opts.FLEXIBLE_RUNNER_TYPE),
        ("runner_type = 'Runner'\n", opts.RUNNER_TYPE),
    ],
    ids=['no_runner_type', 'strategy', 'own_runner'],
)
def test_settings_include_gets_the_protected_runner(tmp_path, body, expected):
    """The settings-only twin sets no ``runner_type``: ``tools/train.py``
    builds the protected runner of the config's own (or none)."""
    path = tmp_path / 'cfg.py'
    path.write_text(f'_base_ = {[TINY_COCO_CONFIG, SETTINGS]!r}\n{body}')
    cfg = Config.fromfile(str(path))
    assert cfg.nanguard == Config.fromfile(INCLUDE).nanguard
    assert opts.apply_guard_option(cfg, None)
    assert cfg.runner_type == expected


def test_settings_with_a_runner_without_counterpart_are_refused():
    """Settings no runner would use: an error, not an unprotected run."""
    cfg = Config(dict(runner_type='MyRunner', nanguard=dict(policy='skip')))
    with pytest.raises(ValueError, match="runner_type='MyRunner'"):
        opts.apply_guard_option(cfg, None)
    # unless the config adds the hook by hand
    cfg.custom_hooks = [dict(type='mmnanguard.NanGuardHook')]
    assert 'NanGuardHook' in opts.apply_guard_option(cfg, None)


def _two_bases(tmp_path, other: str, include: str) -> str:
    (tmp_path / 'other.py').write_text(other)
    bases = [TINY_COCO_CONFIG, str(tmp_path / 'other.py'), include]
    path = tmp_path / 'cfg.py'
    path.write_text(f'_base_ = {bases!r}\n')
    return str(path)


def test_runner_type_of_another_base_names_the_twin(tmp_path):
    path = _two_bases(tmp_path, "runner_type = 'FlexibleRunner'\n", INCLUDE)
    with pytest.raises(IncludeCollisionError) as err:
        load_training_config(path)
    assert path in str(err.value) and SETTINGS_INCLUDE in str(err.value)
    proc = subprocess.run(
        [sys.executable, osp.join(REPO, 'tools', 'doctor.py'), path],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONWARNINGS='ignore::UserWarning'),
    )
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert 'IncludeCollisionError' in line and SETTINGS_INCLUDE in line
    # the twin loads, and another duplicate key stays mmengine's error
    twin = _two_bases(tmp_path, "runner_type = 'FlexibleRunner'\n", SETTINGS)
    assert load_training_config(twin).runner_type == 'FlexibleRunner'
    other = _two_bases(tmp_path, 'nanguard = dict()\n', SETTINGS)
    with pytest.raises(KeyError, match='Duplicate key'):
        load_training_config(other)


@pytest.mark.slow
def test_flexible_runner_trains_and_skips_a_fault(tiny_coco_root, tmp_path):
    """One process, ``SingleDeviceStrategy``: the protected flexible runner
    trains mmdet's RetinaNet, an inf loss at iteration 1 is skipped (the
    weights after it equal those before it)."""
    path = _write(
        tmp_path,
        "strategy = dict(type='SingleDeviceStrategy')\n"
        "custom_imports = dict(imports=['mmnanguard.testing'],"
        ' allow_failed_imports=False)\n'
        "custom_hooks = [dict(type='FaultInjectionHook', fault='inf_loss',"
        ' iteration=1)]\n'
        'nanguard = dict(hooks=[])\n',
    )
    cfg = load_tiny_config(
        path, str(tmp_path / 'work'), tiny_coco_root, max_iters=2
    )
    runner = RUNNERS.build(cfg)
    seen = {}

    from mmengine.hooks import Hook

    class Weights(Hook):
        priority = 'LOWEST'

        def after_train_iter(self, runner, batch_idx, *args, **kwargs):
            seen[batch_idx] = {
                k: v.clone() for k, v in runner.model.state_dict().items()
            }

    runner.register_hook(Weights())
    runner.train()
    guard = next(h for h in runner.hooks if isinstance(h, NanGuardHook))
    assert guard.counters['skipped'] == 1
    for name, before in seen[0].items():
        assert torch.equal(seen[1][name], before), name


def test_strategy_checkpoint_keys_lose_the_wrapper_prefix():
    model = torch.nn.Sequential(torch.nn.Linear(2, 3))
    wrapped = {f'module.{k}': v + 1 for k, v in model.state_dict().items()}
    state = model_state_for(wrapped, model)
    assert state.keys() == model.state_dict().keys()
    model.load_state_dict(state)  # strict: every key matches
    assert torch.equal(model[0].weight, wrapped['module.0.weight'])
    # a model whose own keys start with module. keeps them
    holder = torch.nn.Module()
    holder.module = torch.nn.Linear(2, 3)
    own = holder.state_dict()
    assert model_state_for(own, holder).keys() == own.keys()
