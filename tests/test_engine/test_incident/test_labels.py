# Copyright (c) mmnanguard contributors. All rights reserved.
"""A report's action, stage, cause and kind are enum members, live and
after a round trip through report.json, and a wrong word is refused by
name."""

import json

import pytest

from mmnanguard.engine.guard.policy import decide_action
from mmnanguard.engine.guard.settings import GuardSettings
from mmnanguard.engine.guard.stage import STAGES, live_stage
from mmnanguard.engine.guard.verdict import StepVerdict
from mmnanguard.engine.incident import (
    Cause,
    IncidentAction,
    IncidentKind,
    IncidentReport,
    Stage,
)


def _report(**kw):
    base = dict(iteration=3, epoch=0, kind='nonfinite_loss', action='skip')
    return IncidentReport(reason='policy=skip', **{**base, **kw})


def test_strings_become_members_and_json_holds_the_strings():
    report = _report(stage='loss')
    report['cause'] = 'data'
    assert report.kind is IncidentKind.NONFINITE_LOSS
    assert report.action is IncidentAction.SKIP
    assert report.stage is Stage.LOSS and report.cause is Cause.DATA
    data = json.loads(json.dumps(report.to_dict()))
    assert (data['kind'], data['action'], data['stage'], data['cause']) == (
        'nonfinite_loss',
        'skip',
        'loss',
        'data',
    )
    back = IncidentReport.from_dict(data)
    assert back.stage is Stage.LOSS and back.cause is Cause.DATA
    assert f'{back.action}/{back.kind}' == 'skip/nonfinite_loss'


@pytest.mark.parametrize(
    'field,value',
    [
        ('action', 'retry'),
        ('stage', 'preprocess'),
        ('cause', 'nan'),
        ('kind', 'nan_loss'),
    ],
)
def test_a_wrong_word_is_refused_naming_the_field(field, value):
    report = _report()
    with pytest.raises(ValueError, match=rf"{field}='{value}' is not one of"):
        report[field] = value
    data = dict(_report().to_dict(), **{field: value})
    with pytest.raises(ValueError, match=field):
        IncidentReport.from_dict(data)


def test_unset_stage_and_cause_stay_none_and_out_of_the_json():
    report = _report()
    assert report.stage is None and report.cause is None
    assert 'cause' not in report.to_dict()


@pytest.mark.parametrize(
    'policy,kind,skips,expected',
    [
        ('skip', 'nonfinite_loss', 0, IncidentAction.SKIP),
        ('skip', 'nonfinite_params', 0, IncidentAction.ROLLBACK),
        ('skip', 'nonfinite_loss', 99, IncidentAction.ROLLBACK),
        ('rollback', 'nonfinite_grad', 0, IncidentAction.ROLLBACK),
        ('raise', 'nonfinite_grad', 0, IncidentAction.RAISE),
    ],
)
def test_the_policy_returns_members(policy, kind, skips, expected):
    settings = GuardSettings(policy=policy, escalate_to='rollback')
    action, _ = decide_action(settings, kind, skips, 0, True)
    assert action is expected


def test_the_live_stage_is_a_member_in_the_order_of_the_iteration():
    assert STAGES == (
        'data',
        'forward',
        'loss',
        'backward',
        'optimizer',
        'checkpoint',
    )
    bad_inputs = StepVerdict(iteration=0, loss_finite=False)
    bad_inputs.inputs_finite = False
    assert live_stage('nonfinite_loss', bad_inputs)['stage'] is Stage.DATA
    bad_loss = StepVerdict(iteration=0, loss_finite=False)
    bad_loss.inputs_finite = True
    assert live_stage('nonfinite_loss', bad_loss)['stage'] is Stage.LOSS
    found = live_stage(IncidentKind.NONFINITE_CHECKPOINT, None)
    assert found['stage'] is Stage.CHECKPOINT
