# Copyright (c) mmnanguard contributors. All rights reserved.
"""``Runner.from_cfg`` / ``FlexibleRunner.from_cfg`` never drop the
``nanguard`` settings in silence (``engine/runner/upstream_builds.py``):
the upstream scripts' two ways of building a runner, on a config with the
settings and mmengine's own runner, build the protected counterpart with a
warning; a runner class with no counterpart gets a warning naming the fix;
nothing changes without the settings or with the hook in custom_hooks.
"""

import logging

import pytest
from mmengine.config import Config
from mmengine.logging import MMLogger
from mmengine.registry import DATASETS, MODELS, RUNNERS
from mmengine.runner import FlexibleRunner, Runner

from mmnanguard.engine.runner import NanGuardFlexibleRunner, NanGuardRunner
from mmnanguard.engine.runner.train_options import default_protection
from mmnanguard.testing.toy import ToyDataset, ToyModel, toy_runner_cfg

MODELS.register_module('UpstreamBuildsToyModel', module=ToyModel, force=True)
DATASETS.register_module(
    'UpstreamBuildsToyDataset', module=ToyDataset, force=True
)


@RUNNERS.register_module(force=True)
class ToolboxOwnRunner(Runner):
    """A toolbox's own runner subclass (no protected counterpart)."""


def _cfg(tmp_path, **extra) -> Config:
    cfg = toy_runner_cfg(
        str(tmp_path),
        model=dict(type='UpstreamBuildsToyModel'),
        env_cfg=dict(dist_cfg=dict(backend='gloo')),
    )
    cfg['train_dataloader']['dataset'] = dict(type='UpstreamBuildsToyDataset')
    cfg.update(extra)
    return Config(cfg)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def warnings_logged():
    handler = _Records()
    logger = MMLogger.get_current_instance()
    logger.addHandler(handler)
    yield handler.messages
    logger.removeHandler(handler)


@pytest.mark.parametrize(
    'runner_type,expected',
    [
        (None, NanGuardRunner),  # the twin: Runner.from_cfg(cfg)
        ('Runner', NanGuardRunner),  # the config's own line
        ('FlexibleRunner', NanGuardFlexibleRunner),
    ],
)
def test_settings_under_mmengine_runner_build_the_counterpart(
    tmp_path, warnings_logged, runner_type, expected
):
    extra = dict(nanguard=dict(policy='rollback'))
    if runner_type is not None:
        extra['runner_type'] = runner_type
    cfg = _cfg(tmp_path, **extra)
    if runner_type is None:
        runner = Runner.from_cfg(cfg)  # as the upstream scripts call it
    else:
        runner = RUNNERS.build(cfg)
    assert type(runner) is expected
    # the config's own options over the include's defaults
    assert runner.protection.guard['policy'] == 'rollback'
    defaults = default_protection()
    assert runner.protection.guard['lr_backoff'] == defaults['lr_backoff']
    said = [m for m in warnings_logged if 'is built instead' in m]
    assert len(said) == 1
    assert f'{expected.__name__}, its protected counterpart' in said[0]
    assert repr(runner_type or 'Runner') in said[0]


def test_runner_without_counterpart_is_named_with_the_fix(
    tmp_path, warnings_logged
):
    cfg = _cfg(
        tmp_path,
        runner_type='ToolboxOwnRunner',
        nanguard=dict(policy='skip'),
    )
    runner = RUNNERS.build(cfg)
    assert type(runner) is ToolboxOwnRunner
    said = [m for m in warnings_logged if 'NOTHING IS PROTECTED' in m]
    assert len(said) == 1
    assert 'ToolboxOwnRunner' in said[0]
    assert "dict(type='NanGuardHook'" in said[0]


@pytest.mark.parametrize(
    'extra',
    [
        dict(),  # no settings
        dict(
            nanguard=dict(policy='skip'),
            custom_hooks=[dict(type='NanGuardHook', policy='skip')],
        ),
    ],
)
@pytest.mark.parametrize('runner_cls', [Runner, FlexibleRunner])
def test_nothing_changes_without_settings_or_with_the_hook(
    tmp_path, warnings_logged, extra, runner_cls
):
    cfg = _cfg(tmp_path, **extra)
    runner = runner_cls.from_cfg(cfg)
    assert type(runner) is runner_cls
    assert not [m for m in warnings_logged if 'built instead' in m]


def test_the_protected_runners_build_as_before(tmp_path, warnings_logged):
    cfg = _cfg(
        tmp_path,
        runner_type='mmnanguard.NanGuardRunner',
        nanguard=default_protection(),
    )
    assert type(RUNNERS.build(cfg)) is NanGuardRunner
    assert not [m for m in warnings_logged if 'built instead' in m]
