# Copyright (c) mmnanguard contributors. All rights reserved.
"""An incident's ``report.json`` is written once, complete with the
diagnosis, as the last file of its folder (the tiny rotated RetinaNet, an
``inf`` loss planted at iteration 0); a diagnosis that fails is recorded
in that one write."""

import glob
import json

from diagnosis_helpers import train_until_incident

import mmnanguard.testing  # noqa: F401  (registers FaultInjectionHook)
from mmnanguard.engine.hooks import nan_diagnosis_hook

FAULT = [dict(type='FaultInjectionHook', fault='inf_loss', iteration=0)]


def test_the_report_is_written_once_and_last(
    tmp_path, tiny_dota_root, incident_writes
):
    _, reports = train_until_incident(
        str(tmp_path), tiny_dota_root, FAULT, max_iters=1
    )
    (report,) = reports
    assert incident_writes == [
        'batch.pth',
        'model.pth',
        'config.py',
        'report.md',
        'timeline.png',
        'report.json',
    ]
    # a planted inf that the replay does not reproduce
    assert report['cause'] == 'transient' and report['diagnosis']['verdict']
    assert report['report_path'] == f"{report['folder']}/report.json"
    # nothing names the temporary folder the files were written in
    assert '.tmp_incident' not in report['markdown']
    assert '.tmp_incident' not in json.dumps(report)
    (log,) = glob.glob(str(tmp_path / '*' / '*.log'))
    with open(log) as f:
        text = f.read()
    assert f"details: {report['folder']}/report.md" in text
    assert '.tmp_incident' not in text


def test_a_failing_diagnosis_is_recorded_in_the_one_write(
    tmp_path, tiny_dota_root, incident_writes, monkeypatch
):
    def fail(*args, **kwargs):
        raise RuntimeError('the replay broke')

    monkeypatch.setattr(nan_diagnosis_hook, 'diagnose', fail)
    _, reports = train_until_incident(
        str(tmp_path), tiny_dota_root, FAULT, max_iters=1
    )
    (report,) = reports
    assert incident_writes == ['batch.pth', 'model.pth', 'report.json']
    assert report['diagnosis_error'] == 'RuntimeError: the replay broke'
    assert 'cause' not in report
