# Copyright (c) mmnanguard contributors. All rights reserved.
"""NanGuardRunner, the ``nanguard`` key, the include and the config
rewrites (toy runners and config loading only; end to end in
``tests/test_integration``)."""

import os.path as osp
import subprocess
import sys

import pytest
from mmengine.config import Config
from mmengine.hooks import EmptyCacheHook

from mmnanguard.engine.hooks import NanGuardHook
from mmnanguard.engine.runner import NanGuardRunner, ProtectionSettings
from mmnanguard.engine.runner import train_options as opts
from mmnanguard.engine.runner.config_rewrites import (
    infer_validate_settings,
    insert_validate_annotations,
    swap_module_types,
)
from mmnanguard.testing import TINY_DOTA_CONFIG
from mmnanguard.testing.toy import toy_runner_cfg

CONFIGS = osp.dirname(osp.dirname(TINY_DOTA_CONFIG))
INCLUDE = osp.join(CONFIGS, '_base_', 'nanguard.py')


def _write(tmp_path, text, name='cfg.py'):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# -- the nanguard key --------------------------------------------------------
def test_protection_defaults_and_split():
    p = ProtectionSettings.from_dict(
        dict(
            policy='rollback',
            lr_backoff=0.25,
            check_labels=True,
            hooks=[dict(type='EmptyCacheHook', when='amp')],
            validate_annotations=dict(policy='filter'),
        )
    )
    assert p.enabled and p.check_labels
    assert p.guard['policy'] == 'rollback' and p.guard['lr_backoff'] == 0.25
    assert 'hooks' not in p.guard and 'check_labels' not in p.guard
    assert p.hooks == [dict(type='EmptyCacheHook', when='amp')]
    assert p.validate_annotations == dict(policy='filter')
    assert ProtectionSettings.from_dict(None).guard['policy'] == 'skip'
    assert not ProtectionSettings.from_dict(dict(policy='off')).enabled


@pytest.mark.parametrize(
    'cfg, error, words',
    [
        (dict(policy='skp'), ValueError, "policy='skp' is invalid"),
        (dict(lr_backof=0.5), ValueError, "unknown setting(s) ['lr_backof']"),
        (dict(hooks=dict(type='X')), TypeError, 'nanguard.hooks='),
        (
            dict(hooks=[dict(type='X', when='gpu')]),
            ValueError,
            "nanguard.hooks[0].when='gpu' is invalid",
        ),
        (dict(check_labels='yes'), TypeError, "check_labels='yes'"),
        (
            dict(validate_annotations='warn'),
            TypeError,
            "validate_annotations='warn'",
        ),
        ([1], TypeError, 'nanguard=[1] is invalid'),
    ],
)
def test_protection_errors_name_the_value(cfg, error, words):
    with pytest.raises(error) as err:
        ProtectionSettings.from_dict(cfg)
    assert words in str(err.value)


# -- the runner on a toy model ----------------------------------------------
def _toy_runner(tmp_path, nanguard, **kwargs):
    return NanGuardRunner(
        **toy_runner_cfg(str(tmp_path), **kwargs), nanguard=nanguard
    )


def _hook_names(runner):
    return [type(h).__name__ for h in runner.hooks]


def test_runner_adds_guard_after_custom_hooks(tmp_path):
    runner = _toy_runner(
        tmp_path,
        dict(policy='rollback', snapshot_interval=2),
        custom_hooks=[dict(type='EMAHook')],
    )
    names = _hook_names(runner)
    assert names.count('NanGuardHook') == 1 and 'EMAHook' in names
    guard = next(h for h in runner.hooks if isinstance(h, NanGuardHook))
    assert guard.settings.policy == 'rollback'
    assert guard.settings.snapshot_interval == 2


def test_runner_keeps_a_configured_guard(tmp_path):
    runner = _toy_runner(
        tmp_path,
        dict(policy='skip'),
        custom_hooks=[dict(type='NanGuardHook', policy='raise')],
    )
    guards = [h for h in runner.hooks if isinstance(h, NanGuardHook)]
    assert len(guards) == 1 and guards[0].settings.policy == 'raise'


def test_runner_off_adds_nothing(tmp_path):
    runner = _toy_runner(tmp_path, dict(policy='off'))
    assert 'NanGuardHook' not in _hook_names(runner)


@pytest.mark.parametrize(
    'wrapper, added', [('OptimWrapper', False), ('CPUAmpOptimWrapper', True)]
)
def test_amp_only_hooks(tmp_path, wrapper, added):
    runner = _toy_runner(
        tmp_path,
        dict(hooks=[dict(type='EmptyCacheHook', when='amp')]),
        optim_wrapper=dict(type=wrapper, optimizer=dict(type='SGD', lr=0.1)),
    )
    assert any(isinstance(h, EmptyCacheHook) for h in runner.hooks) is added


def test_runner_reads_the_nanguard_key_of_cfg(tmp_path):
    kwargs = toy_runner_cfg(str(tmp_path))
    kwargs['cfg'] = dict(nanguard=dict(policy='raise'))
    runner = NanGuardRunner(**kwargs)
    guard = next(h for h in runner.hooks if isinstance(h, NanGuardHook))
    assert guard.settings.policy == 'raise'


# -- the include ----------------------------------------------------------
def test_include_resolves_by_scope_and_sets_two_keys(tmp_path):
    cfg = Config.fromfile(
        _write(tmp_path, "_base_ = ['mmnanguard::_base_/nanguard.py']\n")
    )
    assert set(cfg.keys()) == {'runner_type', 'nanguard'}
    assert cfg.runner_type == 'mmnanguard.NanGuardRunner'
    assert cfg.nanguard.policy == 'skip'
    assert cfg.nanguard.escalate_to == 'rollback'


@pytest.mark.parametrize(
    'upstream',
    [
        'mmrotate::rotated_rtmdet/rotated_rtmdet_tiny-3x-dota.py',
        'mmrotate::rotated_retinanet/'
        'rotated-retinanet-rbox-le90_r50_fpn_amp-1x_dota.py',
        'mmseg::fcn/fcn_r18-d8_4xb2-80k_cityscapes-512x1024.py',
        'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py',
    ],
)
def test_include_adds_to_unmodified_upstream_configs(tmp_path, upstream):
    plain = Config.fromfile(
        _write(tmp_path, f'_base_ = {upstream!r}\n', 'plain.py')
    )
    cfg = Config.fromfile(
        _write(
            tmp_path,
            f"_base_ = [{upstream!r}, 'mmnanguard::_base_/nanguard.py']\n",
        )
    )
    assert cfg.runner_type == 'mmnanguard.NanGuardRunner'
    for key in ('custom_hooks', 'optim_wrapper', 'default_hooks'):
        assert cfg.get(key) == plain.get(key)


def test_a_custom_hooks_include_would_collide(tmp_path):
    """Why the include cannot define custom_hooks (rotated RTMDet)."""
    other = _write(tmp_path, 'custom_hooks = []\n', 'hooks_include.py')
    cfg_path = _write(
        tmp_path,
        '_base_ = ["mmrotate::rotated_rtmdet/'
        f'rotated_rtmdet_tiny-3x-dota.py", {other!r}]\n',
    )
    with pytest.raises(KeyError, match='Duplicate key is not allowed'):
        Config.fromfile(cfg_path)


@pytest.mark.parametrize(
    'variant, policy',
    [('nanguard_strict', 'raise'), ('nanguard_recover', 'rollback')],
)
def test_variants(tmp_path, variant, policy):
    cfg = Config.fromfile(
        _write(tmp_path, f"_base_ = ['mmnanguard::_base_/{variant}.py']\n")
    )
    assert cfg.nanguard.policy == policy
    ProtectionSettings.from_dict(cfg.nanguard)  # valid


def test_scoped_runner_name_imports_mmnanguard():
    """The official scripts do ``RUNNERS.build(cfg)`` on mmengine's root
    registry without importing mmnanguard: the scoped name does it."""
    code = (
        'import sys; from mmengine.registry import RUNNERS; '
        "print('before', 'mmnanguard' in sys.modules); "
        "cls = RUNNERS.get('mmnanguard.NanGuardRunner'); "
        "print('after', cls.__name__, 'mmnanguard' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, '-c', code],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert 'before False' in out.stdout, out.stderr[-2000:]
    assert 'after NanGuardRunner True' in out.stdout


# -- config rewrites --------------------------------------------------------
def test_validate_annotations_settings_from_the_model():
    cfg = Config.fromfile(TINY_DOTA_CONFIG)
    out = infer_validate_settings(cfg, dict(policy='warn'))
    assert out == dict(
        type='ValidateAnnotations',
        policy='warn',
        num_classes=15,
        angle_version='le90',
    )
    seg = dict(model=dict(decode_head=dict(num_classes=19, ignore_index=0)))
    assert infer_validate_settings(seg, {})['ignore_index'] == 0
    two_stage = dict(
        model=dict(
            roi_head=dict(
                bbox_head=[dict(num_classes=3), dict(num_classes=80)]
            )
        )
    )
    assert infer_validate_settings(two_stage, {})['num_classes'] == 80
    with pytest.raises(ValueError, match='ValidateAnnotations is off'):
        infer_validate_settings(dict(model=dict()), {})


def test_insert_validate_annotations_before_pack_in_wrappers():
    pipe = [
        dict(type='mmdet.LoadAnnotations'),
        dict(type='mmdet.PackDetInputs'),
    ]
    loader = dict(
        dataset=dict(
            type='ConcatDataset',
            datasets=[
                dict(type='A', pipeline=list(pipe)),
                dict(type='RepeatDataset', dataset=dict(pipeline=list(pipe))),
            ],
        )
    )
    transform = dict(type='ValidateAnnotations', num_classes=3)
    assert insert_validate_annotations(loader, transform) == (2, None)
    for inner in (
        loader['dataset']['datasets'][0],
        loader['dataset']['datasets'][1]['dataset'],
    ):
        assert [t['type'] for t in inner['pipeline']] == [
            'mmdet.LoadAnnotations',
            'ValidateAnnotations',
            'mmdet.PackDetInputs',
        ]
    changed, why = insert_validate_annotations(loader, transform)
    assert changed == 0 and 'already has ValidateAnnotations' in why


# -- tools/train.py options ---------------------------------------------------
def test_guard_option_on_a_plain_config():
    cfg = Config.fromfile(TINY_DOTA_CONFIG)
    assert 'runner_type' not in cfg
    opts.apply_guard_option(cfg, 'rollback')
    assert cfg.runner_type == opts.RUNNER_TYPE
    include = Config.fromfile(INCLUDE).nanguard
    assert cfg.nanguard == dict(include, policy='rollback')
    plain = Config.fromfile(TINY_DOTA_CONFIG)
    opts.apply_guard_option(plain, 'off')
    assert 'runner_type' not in plain and 'nanguard' not in plain


def test_guard_option_refuses_a_foreign_runner():
    cfg = Config(dict(runner_type='MyRunner'))
    with pytest.raises(ValueError, match="runner_type='MyRunner'"):
        opts.apply_guard_option(cfg, 'skip')


def test_smoke_test_option():
    cfg = Config.fromfile(TINY_DOTA_CONFIG)
    opts.apply_smoke_test(cfg, 7)
    assert cfg.train_cfg == dict(
        type='IterBasedTrainLoop', max_iters=7, val_interval=10**9
    )
    assert cfg.default_hooks.checkpoint is None
    assert cfg.randomness == dict(seed=0)
    assert cfg.nanguard.policy == 'skip'
    assert cfg.nanguard.escalate_to == 'raise'
    assert cfg.nanguard.max_consecutive_skips == 8
    assert cfg.nanguard.history_size == 50


def test_protection_hook_already_configured_is_not_doubled(tmp_path):
    runner = _toy_runner(
        tmp_path,
        dict(hooks=[dict(type='EmptyCacheHook')]),
        custom_hooks=[dict(type='EmptyCacheHook', after_iter=True)],
    )
    hooks = [h for h in runner.hooks if isinstance(h, EmptyCacheHook)]
    assert len(hooks) == 1 and hooks[0]._do_after_iter


def test_include_wires_the_other_protection_hooks():
    hooks = Config.fromfile(INCLUDE).nanguard.hooks
    assert hooks == [
        dict(type='AmpScaleMonitorHook', when='amp'),
        dict(type='NanDiagnosisHook'),
    ]


def test_module_swaps_keep_arguments():
    model = dict(
        bbox_head=dict(
            loss_cls=dict(type='mmdet.FocalLoss', gamma=2.0, alpha=0.25),
            bbox_coder=dict(type='DeltaXYWHTRBBoxCoder', angle_version='le90'),
            loss_bbox=dict(type='mmdet.L1Loss'),
        )
    )
    swaps = {
        s['replace']: s['by']
        for s in ProtectionSettings.from_dict(
            Config.fromfile(
                osp.join(
                    CONFIGS, '_base_', 'safe_modules', 'rotated_retinanet.py'
                )
            ).nanguard
        ).module_swaps
    }
    done = swap_module_types(model, swaps)
    assert len(done) == 2
    head = model['bbox_head']
    assert head['loss_cls'] == dict(
        type='StableFocalLoss', gamma=2.0, alpha=0.25
    )
    assert head['bbox_coder'] == dict(
        type='SafeDeltaXYWHTRBBoxCoder', angle_version='le90'
    )
    assert head['loss_bbox'] == dict(type='mmdet.L1Loss')


@pytest.mark.parametrize(
    'swaps', [dict(a='b'), [dict(replace='A')], [dict(replace='A', by=1)]]
)
def test_module_swaps_errors(swaps):
    with pytest.raises(TypeError, match='nanguard.module_swaps'):
        ProtectionSettings.from_dict(dict(module_swaps=swaps))
