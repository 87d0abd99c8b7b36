# Copyright (c) mmnanguard contributors. All rights reserved.
"""One incident per cause on the real mmrotate rotated RetinaNet, each
built so that the cause, the module, the loss term and the file are known
in advance; the diagnosis must name exactly those."""

import os.path as osp
import subprocess
import sys

import pytest
import torch
from diagnosis_helpers import train_until_incident
from mmengine.hooks import Hook

import mmnanguard.testing  # noqa: F401  (registers FaultInjectionHook)
from mmnanguard.engine.hooks import NanDiagnosisHook

SCALED_MODULE = 'backbone.layer2.0.conv1'
REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.dirname(__file__))))


class PlantNanPixel(Hook):
    """A corrupt float image: one NaN pixel in sample ``sample`` of the
    batch of iteration ``iteration``, as the dataloader yields it."""

    priority = 'VERY_HIGH'

    def __init__(self, iteration: int, sample: int) -> None:
        self.iteration = iteration
        self.sample = sample

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        if runner.iter == self.iteration:
            img = data_batch['inputs'][self.sample].float()
            img[1, 10, 20] = float('nan')
            data_batch['inputs'][self.sample] = img


class HookCounter(Hook):
    """Counts module hooks after every iteration (healthy or not)."""

    def __init__(self):
        self.counts = {}

    def after_train_iter(
        self, runner, batch_idx, data_batch=None, outputs=None
    ):
        self.counts[runner.iter] = sum(
            len(m._forward_hooks)
            + len(m._backward_hooks)
            + len(m._forward_pre_hooks)
            for m in runner.model.modules()
        )


class StateWitness(Hook):
    """Copies model state and gradients right before and right after the
    diagnosis listener."""

    def __init__(self):
        self.seen = {}

    def before_train(self, runner):
        guard = next(
            h for h in runner.hooks if type(h).__name__ == 'NanGuardHook'
        )
        # around the diagnosis: first and last of the guard's listeners
        guard.responder.listeners.insert(0, self._witness('before'))
        guard.responder.listeners.append(self._witness('after'))

    def _witness(self, key):
        def listener(runner, event):
            model = runner.model
            self.seen[key] = (
                {k: v.clone() for k, v in model.state_dict().items()},
                [
                    None if p.grad is None else p.grad.clone()
                    for p in model.parameters()
                ],
                [m.training for m in model.modules()],
                torch.get_rng_state(),
            )

        return listener


def _only_report(reports):
    assert len(reports) == 1, [r['iteration'] for r in reports]
    report = reports[0]
    assert 'diagnosis_error' not in report, report.get('diagnosis_error')
    for name in ('report.md', 'timeline.png', 'config.py', 'model.pth'):
        assert osp.isfile(osp.join(report['folder'], name)), name
    return report


def test_nan_pixel_is_data_naming_the_sample(tmp_path, tiny_dota_root):
    _, reports = train_until_incident(
        str(tmp_path),
        tiny_dota_root,
        [],
        max_iters=1,
        extra_hooks=[PlantNanPixel(iteration=0, sample=1)],
    )
    report = _only_report(reports)
    assert report['cause'] == 'data'
    found = report['evidence']['data']
    assert len(found) == 1
    assert found[0]['check'] == 'image_finite'
    assert found[0]['sample'] == 1 and found[0]['stage'] == 'raw'
    assert found[0]['values'] == [1, 0, 0]  # 1 NaN, 0 +inf, 0 -inf
    bad_file = report['samples'][1]['img_path']
    assert found[0]['img_path'] == bad_file
    assert osp.basename(bad_file) in report['diagnosis']['verdict'][0]
    # the NaN reaches the first conv: the replay is non-finite as well
    assert report['evidence']['replay']['forward_first']['module'] in (
        'data_preprocessor',
        'backbone.conv1',
    )


def test_zero_width_rbox_is_data_naming_file_and_line(
    tmp_path, zero_width_dota
):
    root, broken = zero_width_dota
    _, reports = train_until_incident(str(tmp_path), root, [], max_iters=2)
    report = _only_report(reports)
    assert report['cause'] == 'data'
    found = report['evidence']['data']
    assert [f['check'] for f in found] == ['rbox_size']
    assert found[0]['annfile'] == broken['annfile']
    assert found[0]['line'] == broken['line'] == 2
    assert found[0]['img_path'] == broken['image']
    assert min(found[0]['values'][2:4]) == 0.0  # w or h of the rbox
    # the box reaches the box loss: log(0 / anchor width) = -inf
    assert report['evidence']['replay']['nonfinite_terms'] == [
        'loss',
        'loss_bbox',
    ]
    assert 'P0000.txt line 2' in report['diagnosis']['verdict'][0]
    assert 'ValidateAnnotations' in '\n'.join(report['diagnosis']['remedy'])
    # the replay reproduces the live iteration's loss terms exactly
    assert report['evidence']['replay']['loss_terms'] == report['loss_terms']
    assert report['loss_terms']['loss_bbox'] == 'inf'
    assert isinstance(report['loss_terms']['loss_cls'], float)
    assert report['stage'] == 'loss' and report['reproduced'] is True


@pytest.fixture(scope='module')
def forward_incident(tmp_path_factory, tiny_dota_root):
    """A run whose ``backbone.layer2.0.conv1`` weights were multiplied by
    3e38 at iteration 0: its output overflows from finite inputs."""
    work_dir = str(tmp_path_factory.mktemp('forward'))
    witness = StateWitness()
    runner, reports = train_until_incident(
        work_dir,
        tiny_dota_root,
        [
            dict(
                type='FaultInjectionHook',
                fault='scale_module',
                iteration=0,
                module_name=SCALED_MODULE,
                value=3e38,
            )
        ],
        max_iters=1,
        policy='skip',
        extra_hooks=[witness],
    )
    return runner, _only_report(reports), witness


def test_scaled_module_is_forward_naming_it(forward_incident):
    _, report, _ = forward_incident
    assert report['cause'] == 'forward'
    # live: the loss was the first non-finite value the guard saw; the
    # replay reproduces it and finds the activation before it
    assert report['live']['stage'] == 'loss' and report['stage'] == 'forward'
    first = report['evidence']['replay']['forward_first']
    assert first['module'] == SCALED_MODULE
    assert first['type'] == 'Conv2d' and first['inputs_finite']
    assert first['posinf'] + first['neginf'] > 0
    assert report['evidence']['data'] == []
    weights = report['evidence']['module_weights'][0]
    assert weights['module'] == SCALED_MODULE
    assert float(weights['max_abs']) > 1e36
    assert f'`{SCALED_MODULE}`' in report['diagnosis']['verdict'][0]


def test_replay_leaves_training_state_untouched(forward_incident):
    _, _, witness = forward_incident
    (sd0, g0, m0, rng0), (sd1, g1, m1, rng1) = (
        witness.seen['before'],
        witness.seen['after'],
    )
    assert sd0.keys() == sd1.keys()
    for key in sd0:
        assert torch.equal(sd0[key], sd1[key]) or (
            torch.isnan(sd0[key]).any()
            and torch.equal(sd0[key].nan_to_num(), sd1[key].nan_to_num())
        ), key
    assert [g is None for g in g0] == [g is None for g in g1]
    assert m0 == m1 and torch.equal(rng0, rng1)


def test_sqrt_at_zero_is_backward(tmp_path, tiny_dota_root):
    # priority LOWEST: the fault's loss hook is still on the model when the
    # guard's listeners run, so the replay sees the same loss term
    runner, reports = train_until_incident(
        str(tmp_path),
        tiny_dota_root,
        [
            dict(
                type='FaultInjectionHook',
                fault='nan_grad',
                iteration=0,
                priority='LOWEST',
            )
        ],
        max_iters=1,
    )
    report = _only_report(reports)
    assert report['cause'] == 'backward'
    replay = report['evidence']['replay']
    assert replay['nonfinite_terms'] == [] and replay['forward_first'] is None
    # the fault puts sqrt(sum((w - w.detach())**2)) on the first trainable
    # parameter: only that parameter's gradient is NaN
    first_trainable = next(
        n for n, p in runner.model.named_parameters() if p.requires_grad
    )
    assert [p['name'] for p in replay['param_grads']] == [first_trainable]
    assert replay['term_grads'] == dict(
        loss_cls=True, loss_bbox=True, loss_fault_sqrt=False
    )
    module = first_trainable.rsplit('.', 1)[0]
    assert f'module `{module}`' in report['diagnosis']['verdict'][0]
    assert 'loss_fault_sqrt' in report['diagnosis']['verdict'][0]


def test_lr_ramp_is_explosion_and_no_hooks_while_healthy(
    tmp_path, tiny_dota_root
):
    counter = HookCounter()
    runner, reports = train_until_incident(
        str(tmp_path),
        tiny_dota_root,
        [],
        max_iters=6,
        extra_hooks=[counter],
        # lr 2.5 x 10 per iteration (the tiny config trains at 0.0025)
        param_scheduler=[
            dict(type='ExponentialLR', gamma=10.0, by_epoch=False)
        ],
        **{'optim_wrapper.optimizer.lr': 2.5},
    )
    report = _only_report(reports)
    assert report['cause'] == 'explosion'
    growth = report['evidence']['grad_norm_growth']
    # independent: newest finite grad norm over the smallest before it
    norms = [
        (h['iteration'], h['grad_norm'])
        for h in report['history']
        if isinstance(h['grad_norm'], float)
    ]
    smallest = min(norms[:-1], key=lambda n: n[1])
    assert growth['to_iter'] == norms[-1][0]
    assert growth['from_iter'] == smallest[0]
    assert growth['ratio'] == pytest.approx(norms[-1][1] / smallest[1])
    assert growth['ratio'] >= 100
    assert growth['lr_to'] / growth['lr_from'] == pytest.approx(
        10.0 ** report['iteration']
    )
    # healthy iterations ran without a single module hook, and the
    # diagnosis removed its own
    assert set(counter.counts) == set(range(report['iteration']))
    assert all(n == 0 for n in counter.counts.values())
    assert sum(len(m._forward_hooks) for m in runner.model.modules()) == 0
    hook = next(h for h in runner.hooks if isinstance(h, NanDiagnosisHook))
    assert hook.get_triggered_stages() == ['before_train']


def test_tools_replay_offline_names_the_same_module(forward_incident):
    _, report, _ = forward_incident
    script = osp.join(REPO_ROOT, 'tools', 'replay.py')
    done = subprocess.run(
        [sys.executable, script, report['folder'], '--trust-config'],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    verdict = next(line for line in lines if line.startswith('1. Cause:'))
    assert verdict.startswith('1. Cause: forward')
    assert f'`{SCALED_MODULE}`' in verdict
    assert 'offline:' in done.stdout and 'model.pth' in done.stdout
