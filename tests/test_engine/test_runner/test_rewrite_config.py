# Copyright (c) mmnanguard contributors. All rights reserved.
"""``rewrite_config`` (the include's rewrites without training) on
unmodified upstream configs of the families whose inference used to
refuse, the logged line that turns a check back on, RTMDet's pipeline
switch, and ``--guard`` keeping every ``nanguard.*`` option."""

import glob
import logging
import os.path as osp
import uuid

import pytest
from mmengine.config import Config
from mmengine.registry import RUNNERS

from mmnanguard.engine.runner import ProtectionSettings, rewrite_config
from mmnanguard.engine.runner import train_options as opts
from mmnanguard.testing import TINY_DOTA_CONFIG

INCLUDE = 'mmnanguard::_base_/nanguard.py'
RTMDET = 'mmdet::rtmdet/rtmdet_tiny_8xb32-300e_coco.py'
RPN = 'mmdet::rpn/rpn_r50_fpn_1x_coco.py'
INCLUDE_FILE = osp.join(
    osp.dirname(osp.dirname(TINY_DOTA_CONFIG)), '_base_', 'nanguard.py'
)


def with_include(tmp_path, upstream, extra=''):
    path = tmp_path / 'cfg.py'
    path.write_text(f'_base_ = [{upstream!r}, {INCLUDE!r}]\n{extra}')
    return Config.fromfile(str(path))


def inserted(pipeline):
    """The ValidateAnnotations configs of a pipeline, and whether the last
    one sits right before the Pack*Inputs transform."""
    types = [t['type'] for t in pipeline]
    found = [t for t in pipeline if t['type'] == 'ValidateAnnotations']
    before_pack = bool(found) and types[
        types.index('ValidateAnnotations') + 1
    ].split('.')[-1].startswith('Pack')
    return found, before_pack


# upstream config, classes of its dataset (hand-read), angle version
REFUSED_BEFORE = [
    ('mmrotate::s2anet/s2anet-le135_r50_fpn_1x_dota.py', 15, 'le135'),
    ('mmrotate::r3det/r3det-oc_r50_fpn_1x_dota.py', 15, 'oc'),
    ('mmseg::ocrnet/ocrnet_hr18s_4xb2-40k_cityscapes-512x1024.py', 19, None),
    ('mmdet::solo/solo_r50_fpn_1x_coco.py', 80, None),
    ('mmdet::mask2former/mask2former_r50_8xb2-lsj-50e_coco.py', 80, None),
    (
        'mmdet::mask2former/mask2former_r50_8xb2-lsj-50e_coco-panoptic.py',
        133,
        None,
    ),
    (
        'mmseg::knet/knet-s3_r50-d8_fcn_8xb2-adamw-80k_ade20k-512x512.py',
        150,
        None,
    ),
]


@pytest.mark.parametrize('upstream, classes, angle', REFUSED_BEFORE)
def test_static_rewrite_completes_the_check(
    tmp_path, upstream, classes, angle
):
    cfg = with_include(tmp_path, upstream)
    pipeline_before = list(cfg.train_dataloader.dataset.pipeline)
    out, notes = rewrite_config(cfg)
    assert all(level < logging.WARNING for level, _ in notes), notes
    found, before_pack = inserted(out.train_dataloader.dataset.pipeline)
    assert len(found) == 1 and before_pack
    assert found[0]['num_classes'] == classes
    assert found[0].get('angle_version') == angle
    # a copy: the given config is unchanged
    assert list(cfg.train_dataloader.dataset.pipeline) == pipeline_before


def test_the_logged_line_turns_the_check_back_on(tmp_path):
    """An RPN's labels bound nothing: the check is off, with one WARNING
    giving the config line; that line, with N filled in, turns it on."""
    cfg = with_include(tmp_path, RPN)
    out, notes = rewrite_config(cfg)
    warnings = [msg for level, msg in notes if level == logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].startswith('ValidateAnnotations is off: ')
    assert inserted(out.train_dataloader.dataset.pipeline)[0] == []
    line = warnings[0].split('add to the config: ')[1]
    assert line == (
        "nanguard = dict(validate_annotations=dict(policy='warn', "
        'num_classes=N))'
    )
    fixed = with_include(tmp_path, RPN, line.replace('N)', '80)') + '\n')
    out, notes = rewrite_config(fixed)
    found, before_pack = inserted(out.train_dataloader.dataset.pipeline)
    assert before_pack and found[0]['num_classes'] == 80
    assert all(level < logging.WARNING for level, _ in notes)


def test_switch_pipeline_gets_the_check(tmp_path):
    cfg = with_include(tmp_path, RTMDET)
    out, _ = rewrite_config(cfg)
    switch = [h for h in out.custom_hooks if 'switch_pipeline' in h]
    assert len(switch) == 1
    found, before_pack = inserted(switch[0]['switch_pipeline'])
    assert before_pack and found[0]['num_classes'] == 80
    assert inserted(out.train_dataloader.dataset.pipeline)[1]


def test_runner_reads_the_built_model(tmp_path):
    """The runner: ``num_classes`` from the built RTMDet head, into the
    dataloader config and the built ``PipelineSwitchHook``; the RPN's
    warning logged once."""
    cfg = with_include(tmp_path, RTMDET)
    cfg.model.backbone.init_cfg = None
    cfg.model.bbox_head.num_classes = 7  # the built head decides
    cfg.work_dir = str(tmp_path / 'rtmdet')
    runner = RUNNERS.build(cfg)
    assert runner.model.bbox_head.num_classes == 7
    assert runner.validate_transform['num_classes'] == 7
    found, before_pack = inserted(runner._train_dataloader.dataset.pipeline)
    assert before_pack and found[0]['num_classes'] == 7
    hook = next(
        h for h in runner.hooks if type(h).__name__ == 'PipelineSwitchHook'
    )
    found, before_pack = inserted(hook.switch_pipeline)
    assert before_pack and found[0]['num_classes'] == 7
    # the config's own switch_pipeline is not edited
    assert not inserted(cfg.custom_hooks[-1].switch_pipeline)[0]

    rpn = with_include(tmp_path, RPN)
    rpn.model.backbone.init_cfg = None
    rpn.work_dir = str(tmp_path / 'rpn')
    rpn.experiment_name = f'rpn_warning_once_{uuid.uuid4().hex[:8]}'
    runner = RUNNERS.build(rpn)
    assert runner.validate_transform is None
    log = open(glob.glob(osp.join(runner.log_dir, '*.log'))[0]).read()
    assert log.count('ValidateAnnotations is off') == 1
    assert 'nanguard = dict(validate_annotations=dict(' in log


def test_guard_keeps_every_nanguard_option():
    """``--guard skip --cfg-options nanguard.spike.action=skip`` on a
    config without the include used to run with spikes only logged."""
    cfg = Config.fromfile(TINY_DOTA_CONFIG)
    cfg.merge_from_dict(
        {'nanguard.spike.action': 'skip', 'nanguard.max_rollbacks': 7}
    )
    opts.apply_guard_option(cfg, 'skip')
    include = Config.fromfile(INCLUDE_FILE).nanguard
    assert cfg.nanguard.spike == dict(include.spike, action='skip')
    assert cfg.nanguard.max_rollbacks == 7
    assert cfg.nanguard.policy == 'skip'
    assert cfg.nanguard.hooks == include.hooks
    parsed = ProtectionSettings.from_dict(cfg.nanguard)
    assert parsed.guard['spike']['action'] == 'skip'
    assert parsed.guard['spike']['factor'] == include.spike.factor
    assert parsed.check_labels is True
    smoke = Config.fromfile(TINY_DOTA_CONFIG)
    smoke.merge_from_dict({'nanguard.spike.action': 'skip'})
    opts.apply_smoke_test(smoke, 3)
    assert smoke.nanguard.spike == dict(include.spike, action='skip')


def test_semi_supervised_branches(tmp_path):
    """Soft teacher: each pipeline ends with a MultiBranch that packs its
    branches; the check goes before it, with the detector's classes."""
    cfg = with_include(
        tmp_path,
        'mmdet::soft_teacher/'
        'soft-teacher_faster-rcnn_r50-caffe_fpn_180k_semi-0.1-coco.py',
    )
    out, notes = rewrite_config(cfg)
    assert all(level < logging.WARNING for level, _ in notes), notes
    for dataset in out.train_dataloader.dataset.datasets:
        types = [t['type'] for t in dataset.pipeline]
        assert types[-2:] == ['ValidateAnnotations', 'MultiBranch']
        assert dataset.pipeline[-2]['num_classes'] == 80
