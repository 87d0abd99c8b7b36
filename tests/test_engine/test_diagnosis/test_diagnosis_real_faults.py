# Copyright (c) mmnanguard contributors. All rights reserved.
"""The diagnosis on faults the project did not design for itself.

* rotated RTMDet-tiny with mmrotate's own ``GDLoss(kld)`` on generated DOTA
  data goes NaN by itself (nothing planted): backward, ``loss_bbox``,
  ``SafeGDLoss``, not an explosion of the warmup;
* an FPN conv scaled to overflow: ``forward`` at that conv, not the loss
  that later turns inf;
* a one-shot NaN pixel and a one-shot NaN gradient: ``transient``, with
  the stage the live iteration saw;
* two broken annotation files in one run: both diagnosed, both named, and
  their repeats say which diagnosis they repeat.
"""

import os.path as osp

import pytest
import torch
from diagnosis_helpers import read_reports, train_until_incident
from mmengine.runner import Runner

from mmnanguard.datagen import generate_dota
from mmnanguard.engine.diagnosis.drop_ins import SAFE_MODULES_INCLUDE
from mmnanguard.testing import load_tiny_config
from mmnanguard.testing.tiny_configs import MIM_ROOT

KLD_CONFIG = osp.join(
    MIM_ROOT, 'configs', 'tiny', 'rotated-rtmdet_tiny-kld_tiny-dota.py'
)
FPN_CONV = 'neck.fpn_convs.0.conv'


def train_kld(work_dir, data_root, max_iters, loss_type=None):
    cfg = load_tiny_config(
        KLD_CONFIG, work_dir, data_root, max_iters=max_iters
    )
    if loss_type is not None:
        cfg.model.bbox_head.loss_bbox.type = loss_type
    # the config's own hooks (EMAHook) stay; the guard and the diagnosis
    # join them
    cfg.custom_hooks = list(cfg.custom_hooks) + [
        dict(type='NanGuardHook', policy='skip', snapshot_interval=1),
        dict(type='NanDiagnosisHook'),
    ]
    cfg.default_hooks.checkpoint = dict(
        type='CheckpointHook', interval=10**6, by_epoch=False
    )
    runner = Runner.from_cfg(cfg)
    runner.train()
    return runner, read_reports(work_dir)


@pytest.fixture(scope='module')
def kld_run(tmp_path_factory, tiny_dota_root):
    work_dir = str(tmp_path_factory.mktemp('kld'))
    return train_kld(work_dir, tiny_dota_root, max_iters=4)


def linear_warmup_lr(iteration, base=0.004 / 16, start=1e-5, iters=999):
    """The upstream config's ``LinearLR(start_factor=1e-5, end=1000)`` by
    hand: mmengine goes from ``start`` to 1 over ``end - begin - 1``
    steps, ``base * (start + (1 - start) * t / 999)``."""
    return base * (start + (1 - start) * min(iteration, iters) / iters)


def test_real_kld_nan_is_named_in_loss_bbox_with_safe_gd_loss(kld_run):
    _, reports = kld_run
    report = reports[0]
    assert 'diagnosis_error' not in report, report.get('diagnosis_error')
    replay = report['evidence']['replay']
    live = report['live']
    assert live['inputs_finite'] is True
    # independent of the diagnosis: what the live iteration logged. On
    # this data GDLoss(kld) returns NaN itself (log of a determinant <= 0);
    # elsewhere its gradient goes NaN first with a finite value
    if report['loss_terms']['loss_bbox'] == 'nan':
        expected, bad = 'loss', replay['nonfinite_terms']
        assert replay['loss_first']['module'] == 'bbox_head.loss_bbox'
    else:
        expected = 'backward'
        bad = [k for k, ok in replay['term_grads'].items() if not ok]
        first_param = replay['param_grads'][0]['name']
        assert any(
            f'`{first_param}`' in r for r in report['diagnosis']['remedy']
        )
    assert report['cause'] == expected, report['diagnosis']['summary']
    assert report['stage'] == expected and report['reproduced'] is True
    assert [t for t in bad if t != 'loss'] == ['loss_bbox']
    # the replay reproduces the live loss terms exactly
    assert replay['loss_terms'] == report['loss_terms']
    assert report['evidence']['loss_modules'] == [
        dict(
            term='loss_bbox',
            module='bbox_head.loss_bbox',
            type='GDLoss',
            config_path='model.bbox_head.loss_bbox',
            drop_in='SafeGDLoss',
        )
    ]
    remedy = report['diagnosis']['remedy']
    assert 'SafeGDLoss' in remedy[0] and SAFE_MODULES_INCLUDE in remedy[0]
    assert '`model.bbox_head.loss_bbox`' in remedy[0]
    assert 'None' not in report['markdown']
    assert f'2. Stage: {expected}' in report['markdown']


def test_real_kld_warmup_is_the_schedule_not_an_explosion(kld_run):
    _, reports = kld_run
    history = reports[0]['history']
    assert len(history) == reports[0]['iteration'] + 1
    for entry in history:
        expected = linear_warmup_lr(entry['iteration'])
        assert entry['lr_scheduled'] == pytest.approx(expected, rel=1e-9)
        assert entry['lr'] == pytest.approx(expected, rel=1e-9)
    # the warmup multiplies the lr by 100 and more over these iterations
    assert history[-1]['lr'] / history[0]['lr'] > 100
    off = reports[0]['evidence']['lr_schedule']
    assert off['ratio'] == pytest.approx(1.0, rel=1e-9)
    assert reports[0]['cause'] != 'explosion'


def test_safe_gd_loss_trains_the_same_run_without_incident(
    tmp_path, tiny_dota_root, kld_run
):
    _, reports = kld_run
    runner, safe = train_kld(
        str(tmp_path),
        tiny_dota_root,
        max_iters=reports[0]['iteration'] + 1,
        loss_type='SafeGDLoss',
    )
    assert safe == []
    guard = next(h for h in runner.hooks if type(h).__name__ == 'NanGuardHook')
    assert guard.counters['incidents'] == 0


@pytest.fixture(scope='module')
def fpn_overflow(tmp_path_factory, tiny_dota_root):
    work_dir = str(tmp_path_factory.mktemp('fpn'))
    _, reports = train_until_incident(
        work_dir,
        tiny_dota_root,
        [
            dict(
                type='FaultInjectionHook',
                fault='scale_module',
                iteration=0,
                module_name=FPN_CONV,
            )
        ],
        max_iters=1,
    )
    return reports


def test_fpn_overflow_is_forward_at_the_conv(fpn_overflow):
    (report,) = fpn_overflow
    assert report['cause'] == 'forward', report['diagnosis']['summary']
    # the live iteration saw the inf first in the loss: that is its stage
    assert report['stage'] == 'loss' and report['reproduced'] is True
    replay = report['evidence']['replay']
    assert replay['forward_first'] is None  # huge, finite activations
    assert replay['nonfinite_terms'] == ['loss', 'loss_cls']
    jump = replay['magnitude_first']
    assert jump['module'] == FPN_CONV and jump['weights_out_of_range']
    # independent: the largest |weight| of the replayed conv (model.pth)
    weights = torch.load(
        osp.join(report['folder'], 'model.pth'), weights_only=True
    )
    conv = [weights[f'{FPN_CONV}.weight'], weights[f'{FPN_CONV}.bias']]
    expected = max(float(t.abs().max()) for t in conv)
    assert jump['weight_max'] == expected
    assert 1e30 < jump['out_max'] < float(torch.finfo(torch.float32).max)
    verdict = report['diagnosis']['verdict']
    assert f'`{FPN_CONV}`' in verdict[0]
    assert FPN_CONV in report['diagnosis']['remedy'][0]


@pytest.mark.parametrize(
    'fault, kind, stage',
    [
        ('nan_pixel', 'nonfinite_loss', 'data'),
        ('nan_grad', 'nonfinite_grad', 'backward'),
    ],
)
def test_one_shot_fault_is_transient_with_its_live_stage(
    tmp_path, tiny_dota_root, fault, kind, stage
):
    # the fault's forward hook (priority HIGHEST) is gone when the replay
    # runs: a NaN written once into the preprocessed image, or a loss term
    # with a NaN gradient that happens once
    _, reports = train_until_incident(
        str(tmp_path),
        tiny_dota_root,
        [dict(type='FaultInjectionHook', fault=fault, iteration=0)],
        max_iters=1,
    )
    (report,) = reports
    assert report['kind'] == kind and report['cause'] == 'transient'
    assert report['stage'] == stage and report['reproduced'] is False
    live = report['live']
    assert live['inputs_finite'] is (stage != 'data')
    if stage == 'backward':
        assert live['loss_finite'] is True and live['grad_norm'] == 'nan'
    assert f'stage `{stage}`' in report['diagnosis']['verdict'][0]
    if stage == 'data':
        assert 'data loading' in report['diagnosis']['remedy'][0]


def test_a_fault_that_returns_with_its_samples_is_recurring(
    tmp_path_factory,
):
    # two images, batch 2: every batch holds the same samples; the NaN
    # gradient is planted in iterations 0 and 2 and never in the replay
    root = str(tmp_path_factory.mktemp('same_samples'))
    generate_dota(root, num_images=2, seed=0)
    _, reports = train_until_incident(
        str(tmp_path_factory.mktemp('recurring')),
        root,
        [
            dict(type='FaultInjectionHook', fault='nan_grad', iteration=i)
            for i in (0, 2)
        ],
        max_iters=4,
        policy='skip',
    )
    first, second = reports
    assert {first['iteration'], second['iteration']} == {0, 2}
    assert first['cause'] == 'transient'
    # the same samples, kind and stage: diagnosed again, not a repeat
    assert 'repeat_of' not in second
    assert second['cause'] == 'recurring' and second['reproduced'] is False
    summary = second['diagnosis']['summary']
    assert 'iteration 0' in summary and first['folder'].endswith(
        summary.split('(')[1].split(')')[0]
    )
    assert 'not a one-shot fault' in summary
    assert 'check_dataset' in second['diagnosis']['remedy'][0]


def test_two_broken_files_are_both_diagnosed_and_named(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('two_broken'))
    written = generate_dota(
        root, num_images=4, seed=0, broken=['zero_width', 'collapsed_quad']
    )
    broken = {b['annfile']: b for b in written['broken']}
    work_dir = str(tmp_path_factory.mktemp('two_broken_run'))
    # one image per batch, two epochs: each broken file twice
    train_until_incident(
        work_dir,
        root,
        [],
        max_iters=8,
        policy='skip',
        **{'train_dataloader.batch_size': 1},
    )
    reports = read_reports(work_dir)
    diagnosed = [r for r in reports if 'cause' in r]
    repeats = [r for r in reports if 'repeat_of' in r]
    assert len(diagnosed) == 2 and len(repeats) == 2
    named = set()
    for report in diagnosed:
        assert report['cause'] == 'data'
        (finding,) = report['evidence']['data']
        assert finding['annfile'] in broken
        assert finding['line'] == broken[finding['annfile']]['line']
        name = osp.basename(finding['annfile'])
        assert (
            f'{name} line {finding["line"]}'
            in report['diagnosis']['verdict'][0]
        )
        named.add(finding['annfile'])
    assert named == set(broken)
    by_folder = {osp.basename(r['folder']): r for r in diagnosed}
    for report in repeats:
        earlier = by_folder[report['repeat_of']['folder']]
        assert report['samples'] == earlier['samples']
        assert report['repeat_of']['cause'] == 'data'
        assert report['repeat_of']['folder'] in report['markdown']
