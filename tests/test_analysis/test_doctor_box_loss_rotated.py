# Copyright (c) mmnanguard contributors. All rights reserved.
"""The doctor names reg_decoded_bbox=True for mmrotate's GDLoss_v1 fed
encoded deltas (needs mmrotate)."""

import mmrotate  # noqa: F401
from mmengine.config import Config

from mmnanguard.analysis.doctor import run_doctor
from mmnanguard.testing.tiny_configs import TINY_DOTA_CONFIG


def _config(tmp_path, text, name='cfg.py'):
    path = tmp_path / name
    path.write_text(text)
    return Config.fromfile(str(path))


def _rules(findings):
    return {f.rule: f for f in findings}


def test_gdloss_v1_on_encoded_deltas_is_an_error_with_the_real_fix(tmp_path):
    text = (
        f'_base_ = {TINY_DOTA_CONFIG!r}\n'
        'model = dict(bbox_head=dict(loss_bbox=dict(_delete_=True, '
        "type='GDLoss_v1', loss_type='kld', fun='log1p', tau=1.0){}))\n"
    )
    found = _rules(run_doctor(_config(tmp_path, text.format(''))))
    error = found['box-loss-on-encoded-deltas']
    assert error.severity == 'error'
    assert error.fix == 'model.bbox_head.reg_decoded_bbox=True'
    assert 'GDLoss_v1' in error.message
    fixed = _config(
        tmp_path, text.format(', reg_decoded_bbox=True'), 'fixed.py'
    )
    assert 'box-loss-on-encoded-deltas' not in _rules(run_doctor(fixed))
