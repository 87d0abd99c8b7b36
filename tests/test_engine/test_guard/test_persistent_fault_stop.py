# Copyright (c) mmnanguard contributors. All rights reserved.
"""A persistent fault stops with the whole story: the user case of
mmrotate's ``GDLoss_v1`` put in place of ``L1Loss`` in rotated RetinaNet
without ``reg_decoded_bbox=True``.

The upstream config (``rotated-retinanet-rbox-le90_r50_fpn_1x_dota``) is
loaded with the include and shrunk by ``benchmarks/zoo_cell.py`` (ResNet-18,
generated DOTA images). Fed the coder's encoded deltas, the Gaussian loss
makes a non-finite gradient at every iteration: the guard rolls back until
``max_rollbacks`` is spent and stops. With ``max_incidents=1`` the stopping
incident is still written and diagnosed, and its report.md and the stop
message name ``reg_decoded_bbox=True``, not ``safe_modules.py`` (which has
no drop-in for ``GDLoss_v1``).

``GDLoss_v1(loss_type='kld')`` on encoded deltas depends on the CPU: on
some machines of the pinned stack ``torch.inverse`` of the degenerate
target covariance raises ``torch.linalg.LinAlgError`` at iteration 0 (an
exception no guard of non-finite values sees), on others the loss is NaN.
``loss_type='gwd'`` (no matrix inverse) is the same class and the same
mistake, and its gradient is non-finite at every iteration on every
machine, so it is the persistent fault used here.
"""

import glob
import json
import os.path as osp
import sys

import pytest
from mmengine.registry import RUNNERS

from mmnanguard.engine import NonFiniteTrainingError
from mmnanguard.engine.guard.snapshot import unwrap_model

BENCHMARKS = osp.join(
    osp.dirname(osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))),
    'benchmarks',
)
sys.path.insert(0, BENCHMARKS)

from zoo_cell import build_cell_config  # noqa: E402

CONFIG = (
    'mmrotate::rotated_retinanet/'
    'rotated-retinanet-rbox-le90_r50_fpn_1x_dota.py'
)
MAX_ROLLBACKS = 2


def test_gdloss_on_encoded_deltas_stops_naming_reg_decoded_bbox(tmp_path):
    work_dir = str(tmp_path / 'run')
    cfg, _ = build_cell_config(
        CONFIG, work_dir, str(tmp_path / 'data'), None, 6, 0
    )
    assert cfg.model.bbox_head.loss_bbox.type == 'mmdet.L1Loss'
    cfg.model.bbox_head.loss_bbox = dict(
        type='GDLoss_v1', loss_type='gwd', loss_weight=1.0
    )
    cfg.nanguard.update(
        policy='rollback', max_rollbacks=MAX_ROLLBACKS, max_incidents=1
    )
    runner = RUNNERS.build(cfg)
    with pytest.raises(NonFiniteTrainingError) as raised:
        runner.train()
    message = str(raised.value)
    # the built model is the user's mistake: a box loss on encoded deltas
    head = unwrap_model(runner.model).bbox_head
    assert type(head.loss_bbox).__name__ == 'GDLoss_v1'
    assert head.reg_decoded_bbox is False
    assert f'max_rollbacks={MAX_ROLLBACKS}' in message
    assert 'reg_decoded_bbox=True' in message
    assert 'safe_modules' not in message
    # an incident per iteration: the first, then (max_incidents=1) only
    # the stopping one is written
    stop_iter = MAX_ROLLBACKS
    folders = sorted(glob.glob(osp.join(work_dir, 'nanguard', 'incident_*')))
    assert [osp.basename(f) for f in folders] == [
        'incident_000_iter000000',
        f'incident_001_iter{stop_iter:06d}',
    ]
    with open(osp.join(folders[-1], 'report.json')) as f:
        report = json.load(f)
    assert report['action'] == 'raise'
    assert report['iteration'] == stop_iter
    assert 'repeat_of' not in report and 'diagnosis_skipped' not in report
    (mismatch,) = report['evidence']['encoded_deltas']
    assert mismatch['head'] == 'bbox_head'
    assert mismatch['loss_type'] == 'GDLoss_v1'
    assert 'reg_decoded_bbox=True' in report['diagnosis']['remedy'][0]
    with open(osp.join(folders[-1], 'report.md')) as f:
        markdown = f.read()
    assert 'reg_decoded_bbox=True' in markdown
    assert 'safe_modules' not in markdown


def test_stop_without_the_diagnosis_names_the_fix(tmp_path):
    """Without NanDiagnosisHook the stop message still names the fix,
    found in the built model."""
    work_dir = str(tmp_path / 'run')
    cfg, _ = build_cell_config(
        CONFIG, work_dir, str(tmp_path / 'data'), None, 2, 0
    )
    cfg.model.bbox_head.loss_bbox = dict(
        type='GDLoss_v1', loss_type='gwd', loss_weight=1.0
    )
    cfg.nanguard.update(policy='raise', hooks=[])
    with pytest.raises(NonFiniteTrainingError) as raised:
        RUNNERS.build(cfg).train()
    message = str(raised.value)
    assert 'policy=raise' in message
    assert 'model.bbox_head.reg_decoded_bbox=True' in message


def test_gdloss_kld_on_encoded_deltas_stops_the_train_tool_naming_the_fix(
    tmp_path,
):
    """The user's own case, ``GDLoss_v1(loss_type='kld')``, under
    ``policy='raise'``. On some CPUs of the same pinned stack the inverse
    of the degenerate covariance raises ``LinAlgError`` at iteration 0, on
    others it is a NaN loss (the LAPACK build decides whether the matrix
    is exactly singular). Either way ``tools/train.py`` stops at iteration
    0 with one paragraph naming what happened and
    ``reg_decoded_bbox=True`` (exit 3), not a bare traceback."""
    import contextlib
    import io
    import runpy

    work_dir = str(tmp_path / 'run')
    cfg, _ = build_cell_config(
        CONFIG, work_dir, str(tmp_path / 'data'), None, 3, 0
    )
    cfg.model.bbox_head.loss_bbox = dict(
        type='GDLoss_v1', loss_type='kld', loss_weight=1.0
    )
    cfg.nanguard.update(policy='raise')
    config_file = str(tmp_path / 'kld_on_deltas.py')
    cfg.dump(config_file)
    train = runpy.run_path(
        osp.join(osp.dirname(BENCHMARKS), 'tools', 'train.py')
    )
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = train['main']([config_file, '--work-dir', work_dir])
    text = err.getvalue()
    assert code == 3, text
    if 'LinAlgError' in text:
        assert 'Training crashed at iteration 0' in text
    else:
        assert 'nonfinite_loss at iteration 0' in text, text
        assert 'policy=raise' in text
    assert 'model.bbox_head.reg_decoded_bbox=True' in text
    assert 'Traceback' not in text
