# Copyright (c) mmnanguard contributors. All rights reserved.
"""Every private mmengine field mmnanguard uses exists on the installed
mmengine, on real objects, and each accessor reads what mmengine reads."""

import pytest
import torch
from mmengine._strategy.fsdp import FSDPStrategy
from mmengine.optim import AmpOptimWrapper, OptimWrapper
from mmengine.optim.scheduler import MultiStepLR
from mmengine.runner import EpochBasedTrainLoop, Runner

from mmnanguard.compat import mmengine_private as private
from mmnanguard.testing.toy import ToyDataset, ToyModel


@pytest.fixture
def runner(tmp_path):
    return Runner(
        model=ToyModel(),
        work_dir=str(tmp_path),
        train_dataloader=dict(
            dataset=ToyDataset(8),
            sampler=dict(type='DefaultSampler', shuffle=False),
            batch_size=4,
            collate_fn=dict(type='default_collate'),
        ),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)),
        train_cfg=dict(by_epoch=False, max_iters=2),
        load_from='some.pth',
        resume=True,
    )


def _objects(runner):
    model = runner.model
    param = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([param], lr=0.1)
    wrapper = OptimWrapper(optimizer=optimizer)
    scheduler = MultiStepLR(wrapper, milestones=[1])  # counts its steps
    return {
        'Runner': runner,
        'BaseModel': model,
        'AmpOptimWrapper': AmpOptimWrapper(
            optimizer=optimizer, loss_scale=8.0, dtype=torch.bfloat16
        )
        if torch.cuda.is_available()
        else None,
        'OptimWrapper': wrapper,
        '_ParamScheduler': scheduler,
        'FSDPStrategy': FSDPStrategy(state_dict_cfg='local'),
        'EpochBasedTrainLoop': EpochBasedTrainLoop(
            runner, runner.train_dataloader, max_epochs=2
        ),
    }


def test_every_listed_field_exists(runner):
    for owner, obj in _objects(runner).items():
        if obj is None:  # AmpOptimWrapper needs CUDA; read from the class
            import inspect

            source = inspect.getsource(AmpOptimWrapper.__init__)
            for field in private.FIELDS[owner]:
                assert f'self.{field}' in source, (owner, field)
            continue
        missing = [f for f in private.FIELDS[owner] if not hasattr(obj, f)]
        assert not missing, (
            f'mmengine changed {owner}: no {missing}; update '
            'mmnanguard/compat/mmengine_private.py'
        )


def test_runner_accessors_read_the_runner_arguments(runner):
    assert private.load_request(runner) == ('some.pth', True)
    assert private.has_loaded(runner) is False
    private.mark_loaded(runner)
    assert private.has_loaded(runner) is True
    loader = private.train_dataloader(runner)
    assert isinstance(loader, dict) and loader['batch_size'] == 4
    private.set_train_dataloader(runner, dict(loader, batch_size=2))
    assert runner.train_dataloader.batch_size == 2  # built from it


def test_run_forward_is_what_train_step_calls(runner):
    model = runner.model
    seen = []
    forward = private.run_forward(model)

    def spy(data, mode):
        seen.append(mode)
        return forward(data, mode)

    private.set_run_forward(model, spy)
    batch = next(iter(runner.train_dataloader))
    wrapper = runner.build_optim_wrapper(
        dict(optimizer=dict(type='SGD', lr=0.1))
    )
    losses = model.train_step(batch, wrapper)
    assert seen == ['loss'] and torch.isfinite(losses['loss'])


def test_scheduler_values_and_step_count():
    param = torch.nn.Parameter(torch.ones(1))
    optimizer = torch.optim.SGD([param], lr=0.1)
    scheduler = MultiStepLR(optimizer, milestones=[1], gamma=0.5)
    assert private.scheduler_steps(scheduler) == 0
    assert private.last_values(scheduler) == [0.1]
    optimizer.step()
    scheduler.step()
    assert private.scheduler_steps(scheduler) == 1
    assert private.last_values(scheduler) == [0.05]
    assert private.last_values(object()) == []


def test_count_step_and_a_missing_field_named():
    wrapper = OptimWrapper(
        optimizer=torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1)
    )
    MultiStepLR(wrapper, milestones=[1])  # sets the counter at -1
    private.count_step(wrapper)
    assert wrapper._global_step == 0
    wrapper.step()  # the scheduler's counting step
    assert wrapper._global_step == 1
    with pytest.raises(RuntimeError, match="no '_scale_update_param'"):
        private.static_loss_scale(wrapper)


@pytest.mark.parametrize(
    'state_dict_cfg, full', [('full', True), ('local', False)]
)
def test_fsdp_full_state_dict_reads_the_strategy_setting(state_dict_cfg, full):
    strategy = FSDPStrategy(state_dict_cfg=state_dict_cfg)
    assert private.fsdp_full_state_dict(strategy) is full


def test_end_loop_epoch_counts_as_run_epoch_does(runner):
    loop = EpochBasedTrainLoop(runner, runner.train_dataloader, max_epochs=2)
    assert loop.epoch == 0
    private.end_loop_epoch(loop)
    assert loop.epoch == 1
