# Copyright (c) mmnanguard contributors. All rights reserved.
"""tools/check_loss.py: the table for a config's losses, the two broken
custom losses named, the drop-in shown passing, exit codes, no
traceback for bad input."""

import importlib.util
import json
import os.path as osp
import subprocess
import sys

import pytest
from mmengine.config import Config

from mmnanguard.analysis.loss_battery import battery_cases, run_case
from mmnanguard.config_walk import build_in_scope

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
TOOL = osp.join(REPO, 'tools', 'check_loss.py')
KLD_CONFIG = osp.join(
    REPO, 'configs', 'tiny', 'rotated-rtmdet_tiny-kld_tiny-dota.py'
)
sys.path.insert(0, osp.join(REPO, 'tests', 'test_analysis'))
import custom_losses  # noqa: E402,F401  (registers the broken losses)


def load_tool():
    spec = importlib.util.spec_from_file_location('check_loss', TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope='module')
def tool():
    return load_tool()


def test_names_both_broken_custom_losses(tool, tmp_path, capsys):
    config = tmp_path / 'custom.py'
    config.write_text(
        "model = dict(type='MyDetector', head=dict(\n"
        "    loss_cls=dict(type='HandWrittenCELoss', loss_weight=1.0),\n"
        "    loss_mask=dict(type='ZeroDenominatorDiceLoss'),\n"
        "    loss_box=dict(type='FocalLos')))\n"
    )
    out_json = tmp_path / 'out.json'
    code = tool.main([str(config), '--failures-only', '--json', str(out_json)])
    out = capsys.readouterr().out
    assert code == 1
    assert out.startswith(
        "note: model.head.loss_box: type 'FocalLos' is not registered in "
        'scope None; not checked\n'
    )
    rows = [line.split() for line in out.splitlines()]
    named = {(r[0], r[1]) for r in rows if len(r) > 2}
    assert ('model.head.loss_cls', 'HandWrittenCELoss') in named
    assert ('model.head.loss_mask', 'ZeroDenominatorDiceLoss') in named
    results = json.loads(out_json.read_text())
    assert [(r['path'], r['loss_type'], r['passed']) for r in results] == [
        ('model.head.loss_cls', 'HandWrittenCELoss', False),
        ('model.head.loss_mask', 'ZeroDenominatorDiceLoss', False),
    ]
    dice = {r['case']: r for r in results[1]['results']}
    assert dice['probabilities exactly 0, empty masks']['verdict'] == (
        'non-finite value'
    )
    assert dice['nominal']['passed']


def _verdicts(loss_cfg, scope, **settings):
    """case name -> whether it passes, for each case of the battery on the
    loss built from ``loss_cfg``, each case run on its own."""
    loss = build_in_scope(loss_cfg, scope)
    cases = battery_cases(loss, scope=scope, **settings)
    return {c.name: run_case(loss, c).passed for c in cases}


def test_kld_config_names_the_drop_in(tool, capsys, tmp_path):
    out_json = tmp_path / 'out.json'
    argv = [KLD_CONFIG, '--failures-only', '--json', str(out_json)]
    assert tool.main(argv) == 1
    out = capsys.readouterr().out
    cfg = Config.fromfile(KLD_CONFIG)
    loss_cfg = cfg.model.bbox_head.loss_bbox.to_dict()
    settings = dict(angle_version=cfg.angle_version)
    upstream = _verdicts(loss_cfg, 'mmrotate', **settings)
    failing = [name for name, passed in upstream.items() if not passed]
    assert failing, 'the battery finds no failing case of GDLoss(kld)'
    report = next(
        r
        for r in json.loads(out_json.read_text())
        if r['path'] == 'model.bbox_head.loss_bbox'
    )
    assert report['loss_type'] == 'GDLoss'
    assert [r['case'] for r in report['results'] if not r['passed']] == (
        failing
    )
    # the table: one row per failing case (the drop-in note follows)
    rows = [
        line.split()[:2]
        for line in out.splitlines()
        if line.startswith('model.bbox_head.loss_bbox  ')
    ]
    assert rows == [['model.bbox_head.loss_bbox', 'GDLoss']] * len(failing)
    # the drop-in, on the same cases, passes each of them
    safe = _verdicts(dict(loss_cfg, type='SafeGDLoss'), 'mmrotate', **settings)
    assert all(safe[name] for name in failing)
    note = (
        "model.bbox_head.loss_bbox (GDLoss): safe drop-in type='SafeGDLoss' "
        f'passes {len(failing)} of {len(failing)} failing cases:'
    )
    lines = out.splitlines()
    assert note in lines
    start = lines.index(note) + 1
    listed = lines[start : start + len(failing)]
    assert [line.split(':')[0].strip() for line in listed] == failing
    assert (
        '    zero-width target box: finite'
        in listed[failing.index('zero-width target box')]
    )


def test_one_registered_loss(tool, capsys):
    argv = ['--loss', 'SafeGDLoss', '--scope', 'mmrotate', '--kwargs']
    assert tool.main(argv + ['loss_type=kld']) == 0
    out = capsys.readouterr().out
    verdicts = _verdicts(dict(type='SafeGDLoss', loss_type='kld'), 'mmrotate')
    assert all(verdicts.values())
    # one row per case of the battery, in its order, then the summary
    rows = [line.split('  ')[2].strip() for line in out.splitlines()[1:-2]]
    assert rows == list(verdicts)
    assert out.rstrip().endswith(
        f'1 loss modules, {len(verdicts)} cases, 0 failing'
    )


@pytest.mark.parametrize(
    'argv, message',
    [
        (
            ['no/such/config.py'],
            "config file 'no/such/config.py' does not exist",
        ),
        (['nopkg::x.py'], "package 'nopkg' is not installed"),
        (
            [
                '--loss',
                'SafeGDLoss',
                '--scope',
                'mmrotate',
                '--kwargs',
                'loss_type=bogus',
            ],
            "SafeGDLoss: loss_type must be one of ('gwd', 'kld'",
        ),
        (
            ['--loss', 'NoSuchLoss'],
            "cannot build --loss 'NoSuchLoss' in scope 'mmdet'",
        ),
    ],
)
def test_bad_input_exits_2_without_traceback(tool, capsys, argv, message):
    assert tool.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and 'Traceback' not in err


def test_broken_config_file_as_a_script(tmp_path):
    config = tmp_path / 'broken.py'
    config.write_text('model = dict(type=\n')
    proc = subprocess.run(
        [sys.executable, TOOL, str(config)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert proc.returncode == 2
    assert 'invalid configuration' in proc.stderr
    assert 'SyntaxError' in proc.stderr and 'Traceback' not in proc.stderr


def test_a_heads_default_loss_is_found_in_the_built_model(tool, tmp_path):
    """RetinaNet with ``loss_cls`` left out of the config: ``RetinaHead``
    builds its default (``AnchorHead``'s sigmoid ``CrossEntropyLoss``);
    the battery finds it in the built model, with the head's own
    ``num_classes`` (5 here, not the default 80), and checks the config's
    ``loss_bbox`` once."""
    from mmnanguard.analysis.config_path import resolve_config_path
    from mmnanguard.analysis.loss_battery import check_config_losses

    cfg = Config.fromfile(
        resolve_config_path('mmdet::retinanet/retinanet_r50_fpn_1x_coco.py')
    )
    del cfg.model.bbox_head['loss_cls']
    cfg.model.bbox_head.num_classes = 5
    reports = check_config_losses(cfg)
    assert [(r.path, r.loss_type) for r in reports] == [
        ('model.bbox_head.loss_bbox', 'L1Loss'),
        ('model.bbox_head.loss_cls', 'CrossEntropyLoss'),
    ]
    default = reports[1]
    assert default.error == '' and default.kind == 'classification'
    built = build_in_scope(cfg.model, 'mmdet').bbox_head.loss_cls
    assert built.use_sigmoid is True
    cases = {r.case: r for r in default.results}
    assert 'labels = num_classes (5)' in cases
    assert not any('(80)' in name for name in cases)
