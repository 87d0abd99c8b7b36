# Copyright (c) mmnanguard contributors. All rights reserved.
"""NanGuardHook on a toy model: each optimizer wrapper, accumulation, each
policy, counters in the logs and in checkpoints, poisoned checkpoints."""

import glob
import json
import os
import os.path as osp

import pytest
import torch
from mmengine.hooks import Hook
from mmengine.optim import OptimWrapper, OptimWrapperDict
from mmengine.registry import HOOKS as MMENGINE_HOOKS
from mmengine.runner import Runner
from mmengine.runner.checkpoint import CheckpointLoader

from mmnanguard.engine import NonFiniteTrainingError, PoisonedCheckpointError
from mmnanguard.engine.hooks import NanGuardHook
from mmnanguard.testing import tensors_all_finite
from mmnanguard.testing.toy import (
    ToyModel,
    TwoOptimizerToyModel,
    toy_runner_cfg,
)


def fault(kind, iteration, **kwargs):
    return dict(
        type='FaultInjectionHook', fault=kind, iteration=iteration, **kwargs
    )


def guard(**kwargs):
    return dict(type='NanGuardHook', **kwargs)


class Params(Hook):
    """Copies of all parameters before/after each iteration."""

    priority = 'LOWEST'

    def __init__(self):
        self.before, self.after = {}, {}

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        self.before[runner.iter] = [
            p.detach().clone() for p in runner.model.parameters()
        ]

    def after_train_iter(
        self, runner, batch_idx, data_batch=None, outputs=None
    ):
        self.after[runner.iter] = [
            p.detach().clone() for p in runner.model.parameters()
        ]


def run(tmp_path, hooks, **kwargs):
    runner = Runner(
        **toy_runner_cfg(str(tmp_path), custom_hooks=hooks, **kwargs)
    )
    params = Params()
    runner.register_hook(params)
    runner.train()
    return runner, params


def the_guard(runner) -> NanGuardHook:
    return next(h for h in runner.hooks if isinstance(h, NanGuardHook))


def reports(work_dir):
    return [
        json.load(open(p))
        for p in sorted(
            glob.glob(osp.join(str(work_dir), 'nanguard', '*', 'report.json'))
        )
    ]


def same(xs, ys):
    return all(torch.equal(x, y) for x, y in zip(xs, ys))


def test_triggered_stages():
    assert set(NanGuardHook().get_triggered_stages()) == {
        'before_train',
        'before_train_epoch',  # counts the epoch's trained batches
        'before_train_iter',
        'after_train_iter',
        'before_save_checkpoint',
        'after_load_checkpoint',
        'before_val',  # keeps the generators across validation
        'after_val',
        'after_train',
    }


def test_registered_for_every_scope():
    assert MMENGINE_HOOKS.get('NanGuardHook') is NanGuardHook
    from mmnanguard.registry import HOOKS

    assert HOOKS.get('mmnanguard.NanGuardHook') is NanGuardHook


@pytest.mark.parametrize(
    'settings, key',
    [
        (dict(policy='skiip'), 'policy'),
        (dict(escalate_to='skip'), 'escalate_to'),
        (dict(snapshot_interval=-1), 'snapshot_interval'),
        (dict(snapshot_interval=0), 'snapshot_interval'),
        (dict(param_check_interval=-2), 'param_check_interval'),
        (dict(lr_backoff=0), 'lr_backoff'),
        (dict(lr_backoff=1.5), 'lr_backoff'),
        (dict(lr_backoff='half'), 'lr_backoff'),
        (dict(max_rollbacks=0), 'max_rollbacks'),
        (dict(rollback_source='disk'), 'rollback_source'),
        (dict(polcy='skip'), 'polcy'),
    ],
)
def test_bad_settings_fail_when_runner_is_built(tmp_path, settings, key):
    with pytest.raises(ValueError) as err:
        Runner(
            **toy_runner_cfg(str(tmp_path), custom_hooks=[guard(**settings)])
        )
    message = str(err.value)
    assert key in message
    if key in settings and key != 'polcy':
        assert repr(settings[key]) in message


@pytest.mark.parametrize('wrapper', ['fp32', 'fp32_clip', 'bf16'])
@pytest.mark.parametrize(
    'kind, incident',
    [
        ('inf_loss', 'nonfinite_objective'),
        ('nan_grad', 'nonfinite_grad'),
        ('nan_pixel', 'nonfinite_objective'),
    ],
)
def test_skip_keeps_weights_bit_identical(tmp_path, wrapper, kind, incident):
    optim = dict(
        type='OptimWrapper', optimizer=dict(type='SGD', lr=0.01, momentum=0.9)
    )
    model = ToyModel()
    if wrapper == 'fp32_clip':
        optim['clip_grad'] = dict(max_norm=1.0)
    if wrapper == 'bf16':
        model = ToyModel(dtype=torch.bfloat16)
    runner, params = run(
        tmp_path,
        [fault(kind, 2), guard(policy='skip')],
        optim_wrapper=optim,
        model=model,
    )
    assert runner.iter == 6
    assert same(params.before[2], params.after[2])
    assert not same(params.before[3], params.after[3]), 'training goes on'
    g = the_guard(runner)
    assert g.counters['skipped'] == 1 and g.counters[incident] == 1
    (report,) = reports(tmp_path)
    assert report['iteration'] == 2 and report['action'] == 'skip'
    if kind == 'inf_loss':
        assert report['nonfinite_terms'] == {'loss_a': 'inf', 'loss': 'inf'}
    if kind == 'nan_grad':
        assert report['grad_norm'] == 'nan'
        assert report['top_grad_params'][0] == dict(
            name='a.weight', grad_norm='nan'
        )


def test_clip_grad_norm_is_read_once_and_clips(tmp_path):
    max_norm = 1e-3
    optim = dict(
        type='OptimWrapper',
        clip_grad=dict(max_norm=max_norm),
        optimizer=dict(type='SGD', lr=0.01),
    )
    runner, params = run(tmp_path, [guard()], optim_wrapper=optim)
    # the norm the guard read is the one mmengine logged (as a float the
    # guard handed back: no second read)
    logged = runner.message_hub.get_scalar('train/grad_norm').current()
    entry = the_guard(runner).history.to_list()[-1]
    assert entry['grad_norm'] == pytest.approx(logged)
    assert logged > max_norm
    # and the gradients were clipped with it: plain SGD moves the weights
    # by lr * max_norm in norm when the norm is above max_norm
    last = runner.iter - 1
    delta = torch.cat(
        [
            (a - b).flatten()
            for a, b in zip(params.after[last], params.before[last])
        ]
    )
    assert float(delta.norm()) == pytest.approx(0.01 * max_norm, rel=1e-2)


def test_amp_scaler_skips_are_counted_not_incidents(tmp_path):
    optim = dict(
        type='CPUAmpOptimWrapper',
        dtype='float16',
        loss_scale=dict(init_scale=2.0**40, growth_interval=1000),
        optimizer=dict(type='SGD', lr=0.01),
    )
    runner, _ = run(
        tmp_path, [guard(policy='raise')], optim_wrapper=optim, max_iters=8
    )
    g = the_guard(runner)
    scaler = runner.optim_wrapper.loss_scaler
    # every halving of the scale is one skipped step, none an incident
    halvings = round(
        torch.log2(torch.tensor(2.0**40 / scaler.get_scale())).item()
    )
    assert halvings >= 1
    assert g.counters['amp_skipped'] == halvings
    assert g.counters['incidents'] == 0 and reports(tmp_path) == []


def test_optim_wrapper_dict_guards_each_member(tmp_path):
    model = TwoOptimizerToyModel()
    optim = OptimWrapperDict(
        a=OptimWrapper(torch.optim.SGD(model.a.parameters(), lr=0.1)),
        b=OptimWrapper(torch.optim.SGD(model.b.parameters(), lr=0.1)),
    )
    runner, params = run(
        tmp_path,
        [fault('inf_loss', 2, loss_key='loss_b'), guard(policy='skip')],
        optim_wrapper=optim,
        model=model,
    )
    # parameters: a.weight, a.bias, b.weight, b.bias
    before, after = params.before[2], params.after[2]
    assert not same(before[:2], after[:2]), 'a stepped on its finite loss'
    assert same(before[2:], after[2:]), 'b skipped its non-finite loss'
    g = the_guard(runner)
    assert (
        g.counters['nonfinite_objective'] == 1 and g.counters['skipped'] == 1
    )
    assert runner.iter == 6


@pytest.mark.parametrize(
    'kind, at',
    [('inf_loss', 2), ('inf_loss', 3), ('nan_grad', 2), ('nan_grad', 3)],
)
def test_accumulation_drops_the_poisoned_window(tmp_path, kind, at):
    optim = dict(
        type='OptimWrapper',
        accumulative_counts=2,
        optimizer=dict(type='SGD', lr=0.1),
    )
    runner, params = run(
        tmp_path, [fault(kind, at), guard(policy='skip')], optim_wrapper=optim
    )
    # window [2, 3] steps at iteration 3: dropped as a whole
    assert same(params.before[2], params.after[3])
    assert not same(params.before[4], params.after[5])
    g = the_guard(runner)
    assert g.counters['skipped'] == 1 and g.counters['incidents'] == 1
    # a non-finite loss is seen in its own micro-batch; non-finite gradients
    # are seen at the window's step, where the summed gradients are checked
    assert reports(tmp_path)[0]['iteration'] == (
        at if kind == 'inf_loss' else 3
    )


def test_raise_names_iteration_terms_and_report(tmp_path):
    with pytest.raises(NonFiniteTrainingError) as err:
        run(tmp_path, [fault('inf_loss', 3), guard(policy='raise')])
    message = str(err.value)
    (report,) = reports(tmp_path)
    for needle in (
        'iteration 3',
        'epoch 0',
        'loss_a=inf',
        'grad_norm=',
        report['report_path'],
    ):
        assert needle in message


def test_skip_escalates_after_max_consecutive_skips(tmp_path):
    hooks = [fault('inf_loss', i) for i in (2, 3, 4)]
    hooks.append(
        guard(policy='skip', max_consecutive_skips=2, escalate_to='raise')
    )
    with pytest.raises(NonFiniteTrainingError, match='max_consecutive_skips'):
        run(tmp_path, hooks)
    assert [r['action'] for r in reports(tmp_path)] == [
        'skip',
        'skip',
        'raise',
    ]


def test_rollback_restores_state_and_backs_off_lr(tmp_path):
    sched = [
        dict(type='LinearLR', start_factor=0.5, by_epoch=False, begin=0, end=4)
    ]
    runner, params = run(
        tmp_path,
        [
            fault('nan_optimizer_state', 3),
            guard(policy='rollback', snapshot_interval=2, lr_backoff=0.5),
        ],
        param_scheduler=sched,
        max_iters=5,
    )
    g = the_guard(runner)
    assert g.counters['rollbacks'] == 1
    (report,) = reports(tmp_path)
    assert report['kind'] == 'nonfinite_params' and report['iteration'] == 3
    # the snapshot was taken after iteration 1 (start of iteration 2)
    assert same(params.after[1], params.after[3])
    assert tensors_all_finite(runner.optim_wrapper.optimizer.state_dict())
    # lr: LinearLR gives 0.01 * (0.5 + 0.5 * n / 3) after n steps. The
    # parameter check of step 3 is read before the checkpoint of iteration
    # 3 is written, after the scheduler's step of iteration 3: the rollback
    # restores the snapshot (start of iteration 2: n = 1) with its lr times
    # the backoff, and the scheduler steps once more (iteration 4: n = 2)
    assert g.snapshots[-1].iteration == 2
    schedule = [0.01 * (0.5 + 0.5 * n / 3) for n in range(4)]
    assert runner.optim_wrapper.get_lr()['lr'][0] == pytest.approx(
        0.5 * schedule[2]
    )


def test_max_rollbacks_then_raise(tmp_path):
    hooks = [fault('inf_loss', i) for i in (2, 3)]
    hooks.append(guard(policy='rollback', max_rollbacks=1))
    with pytest.raises(NonFiniteTrainingError, match='max_rollbacks=1'):
        run(tmp_path, hooks)


def test_counters_reach_text_log_and_visualizer(tmp_path):
    runner, _ = run(
        tmp_path,
        [fault('inf_loss', 2), guard()],
        visualizer=dict(
            type='Visualizer',
            vis_backends=[
                dict(type='LocalVisBackend'),
                dict(type='TensorboardVisBackend'),
            ],
        ),
    )
    log = open(glob.glob(osp.join(str(tmp_path), '*', '*.log'))[0]).read()
    assert 'nanguard_skipped: 1 ' in log
    assert 'nanguard_nonfinite_objective: 1 ' in log
    scalars = [
        json.loads(line)
        for line in open(
            glob.glob(
                osp.join(str(tmp_path), '*', 'vis_data', 'scalars.json')
            )[0]
        )
    ]
    assert scalars[-1]['nanguard_skipped'] == 1
    from tensorboard.backend.event_processing.event_accumulator import (
        EventAccumulator,
    )

    events = EventAccumulator(
        glob.glob(osp.join(str(tmp_path), '*', 'vis_data'))[0]
    )
    events.Reload()
    assert [s.value for s in events.Scalars('nanguard_skipped')][-1] == 1


def test_counters_saved_and_restored_on_resume(tmp_path):
    runner, _ = run(tmp_path, [fault('inf_loss', 1), guard()], max_iters=4)
    ckpt = CheckpointLoader.load_checkpoint(
        osp.join(str(tmp_path), 'iter_4.pth')
    )
    assert ckpt['nanguard']['counters']['skipped'] == 1
    resumed = Runner(
        **toy_runner_cfg(
            str(tmp_path), max_iters=6, custom_hooks=[guard()], resume=True
        )
    )
    resumed.train()
    assert the_guard(resumed).counters['skipped'] == 1
    assert (
        resumed.message_hub.get_scalar('train/nanguard_skipped').current() == 1
    )


def test_resume_marks_the_incidents_it_discards(tmp_path):
    # iter_2.pth holds iterations 0-1 (checkpoints every 2 iterations);
    # incidents at 2 and 4; the run resumes from iter_2.pth as after a crash
    run(
        tmp_path,
        [fault('inf_loss', 2), fault('inf_loss', 4), guard()],
        max_iters=5,
    )
    first = sorted(
        glob.glob(osp.join(str(tmp_path), 'nanguard', 'incident_*'))
    )
    assert [osp.basename(f) for f in first] == [
        'incident_000_iter000002',
        'incident_001_iter000004',
    ]
    resumed = Runner(
        **toy_runner_cfg(
            str(tmp_path),
            max_iters=6,
            custom_hooks=[guard()],
            resume=True,
            load_from=osp.join(str(tmp_path), 'iter_2.pth'),
        )
    )
    resumed.train()
    # iteration 2 and later were discarded by resuming at iteration 2
    for folder in first:
        assert osp.isfile(osp.join(folder, 'DISCARDED'))
        report = json.load(open(osp.join(folder, 'report.json')))
        assert report['discarded_by_resume'] is True
        assert report['resumed_at_iteration'] == 2
    assert the_guard(resumed).counters['incidents'] == 0  # iter_2.pth's


@pytest.mark.parametrize('policy', ['raise', 'skip'])
def test_poisoned_checkpoint_is_never_written(tmp_path, policy):
    # the per-iteration parameter check is off: the checkpoint check is the
    # last line of defence
    hooks = [
        fault('nan_optimizer_state', 3),
        guard(policy=policy, param_check_interval=0),
    ]
    if policy == 'raise':
        with pytest.raises(PoisonedCheckpointError):
            run(tmp_path, hooks)
        assert not osp.exists(osp.join(str(tmp_path), 'iter_4.pth'))
        last = open(osp.join(str(tmp_path), 'last_checkpoint')).read()
        assert last.endswith('iter_2.pth')
    else:
        runner, _ = run(tmp_path, hooks)
        assert the_guard(runner).counters['poisoned_checkpoints'] == 1
        assert the_guard(runner).counters['rollbacks'] == 1
    for path in glob.glob(osp.join(str(tmp_path), '*.pth')):
        ckpt = CheckpointLoader.load_checkpoint(path)
        assert tensors_all_finite(ckpt['state_dict']), path
        assert tensors_all_finite(ckpt['optimizer']), path
    assert reports(tmp_path)[0]['kind'] == 'nonfinite_checkpoint'


def test_rollback_from_last_good_checkpoint(tmp_path):
    runner, params = run(
        tmp_path,
        [
            fault('nan_optimizer_state', 3),
            guard(
                policy='rollback',
                rollback_source='checkpoint',
                snapshot_interval=100,
            ),
        ],
    )
    g = the_guard(runner)
    assert g.counters['rollbacks'] == 1
    ckpt = CheckpointLoader.load_checkpoint(
        osp.join(str(tmp_path), 'iter_2.pth')
    )
    restored = dict(runner.model.named_parameters())
    # iteration 3 ended on the checkpoint of iteration 2 (after 2 steps)
    assert torch.equal(params.after[3][0], ckpt['state_dict']['a.weight'])
    assert restored['a.weight'].isfinite().all()


class Truncate(Hook):
    """Cut checkpoints short on disk before ``iteration`` (a kill or a full
    disk in the middle of their write)."""

    def __init__(self, iteration, names):
        self.iteration, self.names = iteration, names

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        if runner.iter == self.iteration:
            for name in self.names:
                path = osp.join(runner.work_dir, name)
                with open(path, 'r+b') as f:
                    f.truncate(os.path.getsize(path) // 2)


@pytest.mark.parametrize(
    'truncated, restored_from',
    [(['iter_4.pth'], 'iter_2.pth'), (['iter_2.pth', 'iter_4.pth'], None)],
)
def test_rollback_skips_a_truncated_checkpoint(
    tmp_path, truncated, restored_from
):
    runner = Runner(
        **toy_runner_cfg(
            str(tmp_path),
            custom_hooks=[
                fault('nan_optimizer_state', 5),
                guard(
                    policy='rollback',
                    rollback_source='checkpoint',
                    snapshot_interval=3,
                ),
            ],
        )
    )
    runner.register_hook(Truncate(5, truncated))
    runner.train()
    g = the_guard(runner)
    assert g.counters['rollbacks'] == 1
    log = open(glob.glob(osp.join(str(tmp_path), '*', '*.log'))[0]).read()
    # a truncated file never verifies, so it is never a candidate
    if restored_from is None:  # nothing loads: the memory snapshot
        assert 'rolling back to the in-memory snapshot' in log
        assert g.last_restored.source == 'memory'
        assert g.last_restored.iteration == 3
    else:
        assert g.last_restored.source == osp.join(str(tmp_path), restored_from)
        assert g.last_restored.iteration == 2
    assert all(p.isfinite().all() for p in runner.model.parameters())


def test_max_incidents_bounds_folders(tmp_path):
    hooks = [fault('inf_loss', i) for i in (1, 2, 3)]
    hooks.append(
        guard(policy='skip', max_incidents=2, max_consecutive_skips=5)
    )
    runner, _ = run(tmp_path, hooks)
    assert the_guard(runner).counters['incidents'] == 3
    assert len(reports(tmp_path)) == 2
    batch = torch.load(
        glob.glob(osp.join(str(tmp_path), 'nanguard', '*', 'batch.pth'))[0],
        weights_only=False,
    )
    assert set(batch) == {'data_batch', 'rng_state', 'iteration'}
    assert batch['data_batch']['inputs'].shape == (2, 4)
