# Copyright (c) mmnanguard contributors. All rights reserved.
"""AmpScaleMonitorHook on the real CPU GradScaler with fp16 autocast.

The toy model's inputs are scaled so that its fp16 weight gradients
overflow for every loss scale down to ~2**-9 while its forward (and its
fp32 loss) stays finite: a real fp16 overflow, handled by the GradScaler,
that makes the dynamic scale collapse.
"""

import glob
import json
import os.path as osp

import pytest
import torch
from mmengine.hooks import Hook
from mmengine.optim import OptimWrapperDict
from mmengine.registry import HOOKS as MMENGINE_HOOKS
from mmengine.runner import Runner
from mmengine.runner.checkpoint import CheckpointLoader

from mmnanguard.engine import AmpScaleCollapseError
from mmnanguard.engine.hooks import AmpScaleMonitorHook, NanGuardHook
from mmnanguard.engine.optimizers import (
    CPUAmpOptimWrapper,
    precision_of,
    switch_precision,
)
from mmnanguard.testing.toy import (
    ToyModel,
    TwoOptimizerToyModel,
    toy_runner_cfg,
)

INIT_SCALE = 2.0**16


class OverflowToy(ToyModel):
    """Inputs x1000 and an fp32 loss: finite forward, fp16 weight gradients
    of ~1e7 x ``loss_weight`` (overflow unless scale < 65504 / grad)."""

    def __init__(self, loss_weight: float = 10.0) -> None:
        super().__init__()
        self.loss_weight = loss_weight

    def forward(self, inputs, labels=None, mode: str = 'tensor'):
        x = inputs * 1000.0
        pred_a, pred_b = self.a(x), self.b(x)
        if mode != 'loss':
            return pred_a
        labels = labels.float()
        return dict(
            loss_a=((pred_a.float() - labels) ** 2).mean() * self.loss_weight,
            loss_b=((pred_b.float() - labels) ** 2).mean() * self.loss_weight,
        )


class ScalerTrace(Hook):
    """The GradScaler's own verdict of every ``update`` (found_inf), the
    scale after it, and the monitor's published scalars per iteration."""

    priority = 'LOWEST'

    def __init__(self):
        self.found_inf, self.scale_after = {}, {}
        self.logged = []
        self.after_iter_scale = {}

    def before_train(self, runner):
        wrappers = (
            runner.optim_wrapper.optim_wrappers
            if isinstance(runner.optim_wrapper, OptimWrapperDict)
            else {'': runner.optim_wrapper}
        )
        for name, wrapper in wrappers.items():
            self.found_inf[name], self.scale_after[name] = [], []
            self._wrap(name, wrapper.loss_scaler)

    def _wrap(self, name, scaler):
        update = scaler.update

        def traced(new_scale=None):
            found = sum(
                float(v.sum())
                for state in scaler._per_optimizer_states.values()
                for v in state['found_inf_per_device'].values()
            )
            update(new_scale)
            self.found_inf[name].append(found > 0)
            self.scale_after[name].append(scaler.get_scale())

        scaler.update = traced

    def after_train_iter(
        self, runner, batch_idx, data_batch=None, outputs=None
    ):
        hub = runner.message_hub
        self.logged.append(
            hub.get_scalar('train/amp_scale').current()
            if 'train/amp_scale' in hub.log_scalars
            else None
        )
        self.after_iter_scale[runner.iter] = (
            runner.optim_wrapper.loss_scaler.get_scale()
            if not isinstance(runner.optim_wrapper, OptimWrapperDict)
            else None
        )


def amp_optim(optimizer=None, **kwargs):
    return dict(
        type='CPUAmpOptimWrapper',
        dtype='float16',
        optimizer=optimizer or dict(type='Adam', lr=1e-4),
        **kwargs,
    )


def monitor(**kwargs):
    return dict(type='AmpScaleMonitorHook', **kwargs)


def run(
    tmp_path, hooks, model=None, max_iters=20, tensorboard=False, **kwargs
):
    kwargs.setdefault('optim_wrapper', amp_optim())
    torch.manual_seed(0)  # the toy's initial weights
    runner = Runner(
        **toy_runner_cfg(
            str(tmp_path),
            max_iters=max_iters,
            custom_hooks=hooks,
            model=model or OverflowToy(),
            visualizer=dict(
                type='Visualizer',
                vis_backends=[dict(type='LocalVisBackend')]
                + (
                    [dict(type='TensorboardVisBackend')] if tensorboard else []
                ),
            ),
            **kwargs,
        )
    )
    trace = ScalerTrace()
    runner.register_hook(trace)
    return runner, trace


def the(runner, cls):
    return next(h for h in runner.hooks if isinstance(h, cls))


def adam_steps(runner) -> int:
    """torch's own count of optimizer steps actually taken."""
    param = next(runner.model.parameters())
    return int(runner.optim_wrapper.optimizer.state[param]['step'])


def logged_scalars(work_dir, key):
    path = glob.glob(osp.join(str(work_dir), '*', 'vis_data', 'scalars.json'))[
        0
    ]
    return [
        json.loads(line)[key] for line in open(path) if key in json.loads(line)
    ]


def text_log(work_dir):
    """Every run's text log in ``work_dir`` (a resumed run writes its own),
    oldest first."""
    paths = sorted(glob.glob(osp.join(str(work_dir), '*', '*.log')))
    return ''.join(open(p).read() for p in paths)


def test_triggered_stages_and_registry():
    assert set(AmpScaleMonitorHook().get_triggered_stages()) == {
        'before_train',
        'before_train_iter',
        'after_train_iter',
        'before_save_checkpoint',
        'after_load_checkpoint',
        'after_train',
    }
    assert MMENGINE_HOOKS.get('AmpScaleMonitorHook') is AmpScaleMonitorHook


@pytest.mark.parametrize(
    'kwargs, key',
    [
        (dict(min_loss_scale=0), 'min_loss_scale'),
        (dict(min_loss_scale='1'), 'min_loss_scale'),
        (dict(max_skip_ratio=0.0), 'max_skip_ratio'),
        (dict(max_skip_ratio=1.5), 'max_skip_ratio'),
        (dict(window=0), 'window'),
        (dict(window=True), 'window'),
        (dict(on_collapse='bf32'), 'on_collapse'),
    ],
)
def test_bad_arguments_name_key_and_value(kwargs, key):
    with pytest.raises(ValueError) as err:
        AmpScaleMonitorHook(**kwargs)
    assert key in str(err.value) and repr(kwargs[key]) in str(err.value)


def test_fp16_overflow_collapse_is_logged_counted_and_warned(tmp_path):
    runner, trace = run(
        tmp_path,
        [
            dict(type='NanGuardHook', policy='raise'),
            monitor(min_loss_scale=1.0, window=100, on_collapse='warn'),
        ],
        tensorboard=True,
    )
    runner.train()
    mon = the(runner, AmpScaleMonitorHook)
    # every step overflows: the scale halves every iteration (by hand)
    expected = [INIT_SCALE / 2 ** (i + 1) for i in range(20)]
    assert trace.scale_after[''] == expected
    # the logged trajectory (text log -> vis backend) is that trajectory
    assert logged_scalars(tmp_path, 'amp_scale') == expected
    assert trace.logged == expected
    from tensorboard.backend.event_processing.event_accumulator import (
        EventAccumulator,
    )

    events = EventAccumulator(
        glob.glob(osp.join(str(tmp_path), '*', 'vis_data'))[0]
    )
    events.Reload()
    assert [s.value for s in events.Scalars('amp_scale')] == expected
    assert [s.value for s in events.Scalars('amp_skipped_steps')] == list(
        range(1, 21)
    )
    # skip count: the monitor's == the GradScaler's own found_inf verdicts
    # == the steps torch's Adam never took
    assert mon.skipped[''] == sum(trace.found_inf['']) == 20
    assert 'step' not in runner.optim_wrapper.optimizer.state.get(
        next(runner.model.parameters()), {}
    )
    assert logged_scalars(tmp_path, 'amp_skipped_steps') == list(range(1, 21))
    # the guard counted the overflows, never as an incident
    guard = the(runner, NanGuardHook)
    assert guard.counters['amp_skipped'] == 20
    assert guard.counters['incidents'] == 0
    log = text_log(tmp_path)
    assert (
        'AMP overflow at iteration 0, step skipped, scale 65536 -> '
        '32768' in log
    )
    assert log.count('AMP overflow at iteration') == 20
    # collapse once, at the first scale under the floor (0.5 after iter 16)
    assert mon.collapses[''] == 1
    assert (
        'AMP loss scale collapsed at iteration 16 in float16: scale '
        '0.5 < min_loss_scale=1' in log
    )
    assert precision_of(runner.optim_wrapper) == 'float16'


def test_skip_ratio_collapse_over_window(tmp_path):
    # the floor is out of reach; 5 of the last 10 steps skipped > 40 %
    runner, trace = run(
        tmp_path,
        [monitor(min_loss_scale=1e-30, window=10, max_skip_ratio=0.4)],
        max_iters=6,
    )
    runner.train()
    mon = the(runner, AmpScaleMonitorHook)
    assert mon.skip_ratio() == pytest.approx(6 / 10)
    assert mon.collapses[''] == 1
    assert (
        'AMP loss scale collapsed at iteration 4 in float16: 5 of the '
        'last 10 steps skipped (50% > max_skip_ratio=40%)'
        in text_log(tmp_path)
    )
    assert logged_scalars(tmp_path, 'amp_skip_ratio') == pytest.approx(
        [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    )


def test_collapse_raise(tmp_path):
    runner, _ = run(tmp_path, [monitor(on_collapse='raise')])
    with pytest.raises(AmpScaleCollapseError) as err:
        runner.train()
    assert 'iteration 16' in str(err.value)
    assert 'scale 0.5 < min_loss_scale=1' in str(err.value)
    assert runner.iter == 16


@pytest.mark.parametrize(
    'on_collapse, dtype', [('fp32', torch.float32), ('bf16', torch.bfloat16)]
)
def test_collapse_switches_precision_for_the_rest_of_the_run(
    tmp_path, on_collapse, dtype
):
    runner, trace = run(
        tmp_path,
        [
            dict(type='NanGuardHook', policy='raise'),
            monitor(on_collapse=on_collapse),
        ],
        max_iters=24,
    )
    runner.train()
    wrapper = runner.optim_wrapper
    assert precision_of(wrapper) == str(dtype)[6:]
    with wrapper.optim_context(runner.model):
        out = runner.model(torch.ones(2, 4))
    assert out.dtype == dtype
    # 17 skips down to 0.5, then the scale is reset to 1.0 and every one of
    # the 7 remaining iterations steps (torch's own step count)
    assert trace.found_inf[''] == [True] * 17 + [False] * 7
    assert the(runner, AmpScaleMonitorHook).skipped[''] == 17
    assert adam_steps(runner) == 7
    assert trace.scale_after[''][17:] == [1.0] * 7
    assert the(runner, NanGuardHook).counters['incidents'] == 0
    assert (
        tuple(p.isfinite().all() for p in runner.model.parameters())
        == (True,) * 4
    )
    log = text_log(tmp_path)
    assert (
        f'SWITCHING TO {str(dtype)[6:].upper()} FOR THE REST OF THE RUN' in log
    )


def test_nothing_left_to_switch_to_raises():
    wrapper = CPUAmpOptimWrapper(
        optimizer=torch.optim.SGD(ToyModel().parameters(), lr=0.1)
    )
    hook = AmpScaleMonitorHook(on_collapse='bf16')
    assert hook._switch_target(wrapper) == 'bfloat16'
    switch_precision(wrapper, 'bfloat16')
    assert hook._switch_target(wrapper) == 'float32'
    switch_precision(wrapper, 'float32')
    assert hook._switch_target(wrapper) is None
    with pytest.raises(ValueError, match="precision='float64'"):
        switch_precision(wrapper, 'float64')


def test_scaler_state_and_switch_survive_checkpoint_resume(tmp_path):
    hooks = [monitor(on_collapse='fp32')]
    runner, trace = run(tmp_path, hooks, max_iters=18)
    runner.train()
    ckpt = CheckpointLoader.load_checkpoint(
        osp.join(str(tmp_path), 'iter_16.pth')
    )
    # iteration 15 ended at 65536 / 2**16 = 1.0 (no collapse yet)
    assert ckpt['optimizer']['loss_scaler']['scale'] == 1.0
    assert ckpt['amp_scale_monitor']['skipped'] == {'': 16}
    ckpt = CheckpointLoader.load_checkpoint(
        osp.join(str(tmp_path), 'iter_18.pth')
    )
    assert ckpt['amp_scale_monitor']['precision'] == {'': 'float32'}
    scale_18 = ckpt['optimizer']['loss_scaler']['scale']
    tracker_18 = ckpt['optimizer']['loss_scaler']['_growth_tracker']
    assert (scale_18, tracker_18) == (1.0, 1)  # reset at 16, one step

    class AtStart(Hook):
        priority = 'LOWEST'

        def before_train(self, runner):
            self.scaler = runner.optim_wrapper.loss_scaler.state_dict()
            self.precision = precision_of(runner.optim_wrapper)

    resumed, trace2 = run(
        tmp_path, [monitor(on_collapse='fp32')], max_iters=20, resume=True
    )
    start = AtStart()
    resumed.register_hook(start)
    resumed.train()
    assert start.scaler['scale'] == scale_18
    assert start.scaler['_growth_tracker'] == tracker_18
    assert start.precision == 'float32'
    mon = the(resumed, AmpScaleMonitorHook)
    assert mon.skipped == {'': 17} and mon.precision == {'': 'float32'}
    assert trace2.found_inf[''] == [False, False]
    assert 'resumes in float32' in text_log(tmp_path)


def test_scaler_state_survives_guard_rollback(tmp_path):
    fault = dict(type='FaultInjectionHook', fault='inf_loss', iteration=4)
    runner, trace = run(
        tmp_path,
        [
            fault,
            dict(
                type='NanGuardHook', policy='rollback', snapshot_interval=100
            ),
            monitor(),
        ],
        max_iters=7,
    )
    runner.train()
    guard = the(runner, NanGuardHook)
    assert guard.counters['rollbacks'] == 1
    # the snapshot was taken before training: the initial scaler state
    snap = guard.snapshots[-1].optimizer['loss_scaler']
    assert (snap['scale'], snap['_growth_tracker']) == (INIT_SCALE, 0)
    # iterations 0-3 skip (4096); 4 drops its update (no scaler step), the
    # rollback restores 65536; 5 and 6 skip again from there
    assert trace.after_iter_scale[4] == INIT_SCALE
    assert trace.scale_after[''] == [
        2.0**15,
        2.0**14,
        2.0**13,
        2.0**12,
        2.0**15,
        2.0**14,
    ]
    # the monitor logs the scale before the rollback, and never takes the
    # restored (higher) scale for a step or a lower one for a skip
    assert trace.logged == [
        2.0**15,
        2.0**14,
        2.0**13,
        2.0**12,
        2.0**12,
        2.0**15,
        2.0**14,
    ]
    mon = the(runner, AmpScaleMonitorHook)
    assert mon.skipped[''] == sum(trace.found_inf['']) == 6
    assert mon.steps[''] == 6


class AmpTwoOptimizerToy(TwoOptimizerToyModel):
    """Each member's loss computed under its own wrapper's autocast."""

    def train_step(self, data, optim_wrapper):
        data = self.data_preprocessor(data, True)
        log_vars = {}
        for key in ('a', 'b'):
            with optim_wrapper[key].optim_context(self):
                losses = self._run_forward(data, mode='loss')
            loss, terms = self.parse_losses(
                {f'loss_{key}': losses[f'loss_{key}']}
            )
            optim_wrapper[key].update_params(loss)
            log_vars.update(terms)
        return log_vars


def test_optim_wrapper_dict_members_are_monitored_each(tmp_path):
    torch.manual_seed(0)
    model = AmpTwoOptimizerToy()
    optim = OptimWrapperDict(
        a=CPUAmpOptimWrapper(
            optimizer=torch.optim.SGD(model.a.parameters(), lr=0.01),
            loss_scale=dict(init_scale=2.0**30),
        ),
        b=CPUAmpOptimWrapper(
            optimizer=torch.optim.SGD(model.b.parameters(), lr=0.01),
            loss_scale=dict(init_scale=2.0**4),
        ),
    )
    runner, trace = run(
        tmp_path, [monitor()], model=model, optim_wrapper=optim, max_iters=6
    )
    runner.train()
    mon = the(runner, AmpScaleMonitorHook)
    assert set(mon.skipped) == {'a', 'b'}
    for key in ('a', 'b'):
        assert mon.skipped[key] == sum(trace.found_inf[key])
        assert (
            logged_scalars(tmp_path, f'{key}.amp_scale')
            == trace.scale_after[key]
        )
    assert mon.skipped['a'] >= 3 and mon.skipped['b'] == 0
