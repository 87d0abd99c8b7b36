# Copyright (c) mmnanguard contributors. All rights reserved.
import pytest

from mmnanguard.engine.guard import GuardSettings
from mmnanguard.engine.guard.policy import decide_action
from mmnanguard.engine.guard.snapshot import TrainingSnapshot
from mmnanguard.engine.guard.snapshot_store import SnapshotStore
from mmnanguard.engine.incident import IncidentKind


# (settings, kind, consecutive skips, rollbacks used, has state) -> action
@pytest.mark.parametrize(
    'settings, kind, skips, rollbacks, state, action, reason',
    [
        ({}, 'nonfinite_loss', 0, 0, True, 'skip', 'policy=skip'),
        ({}, 'nonfinite_grad', 4, 0, True, 'skip', 'policy=skip'),
        ({}, 'nonfinite_grad', 5, 0, True, 'rollback', 'consecutive'),
        ({}, 'nonfinite_params', 0, 0, True, 'rollback', 'already'),
        ({}, 'nonfinite_checkpoint', 0, 0, True, 'rollback', 'already'),
        ({}, 'nonfinite_params', 0, 0, False, 'raise', 'no known-good'),
        ({}, 'nonfinite_params', 0, 3, True, 'raise', 'max_rollbacks=3'),
        (
            dict(escalate_to='raise'),
            'nonfinite_params',
            0,
            0,
            True,
            'raise',
            'escalate_to=raise',
        ),
        (
            dict(policy='raise'),
            'nonfinite_loss',
            0,
            0,
            True,
            'raise',
            'policy=raise',
        ),
        (
            dict(policy='rollback'),
            'nonfinite_loss',
            0,
            0,
            True,
            'rollback',
            'policy=rollback',
        ),
        (
            dict(policy='rollback', max_rollbacks=1),
            'nonfinite_loss',
            0,
            1,
            True,
            'raise',
            'max_rollbacks=1',
        ),
        # spikes follow spike.action, not policy
        (
            dict(policy='raise', spike=dict(action='skip')),
            'loss_spike',
            0,
            0,
            True,
            'skip',
            'spike.action=skip',
        ),
        (
            dict(spike=dict(action='rollback')),
            'grad_spike',
            0,
            0,
            True,
            'rollback',
            'spike.action=rollback',
        ),
        # a veto by another extension is a skip
        (
            dict(policy='rollback'),
            'vetoed_update',
            0,
            0,
            True,
            'skip',
            'spike.action=skip',
        ),
    ],
)
def test_decide_action(
    settings, kind, skips, rollbacks, state, action, reason
):
    got, why = decide_action(
        GuardSettings.from_dict(settings), kind, skips, rollbacks, state
    )
    assert got == action
    assert reason in why


# The reason names the setting that decided, whole: a spike under
# policy='raise' with spike.action='skip' is skipped because of
# spike.action, and must not read 'policy=skip'.
@pytest.mark.parametrize(
    'settings, kind, expected',
    [
        (
            dict(policy='raise', spike=dict(action='skip')),
            'loss_spike',
            ('skip', 'spike.action=skip'),
        ),
        (
            dict(policy='skip', spike=dict(action='rollback')),
            'grad_spike',
            ('rollback', 'spike.action=rollback'),
        ),
        (
            dict(policy='rollback'),
            'vetoed_update',
            ('skip', 'spike.action=skip'),
        ),
        (dict(policy='raise'), 'nonfinite_loss', ('raise', 'policy=raise')),
        ({}, 'nonfinite_loss', ('skip', 'policy=skip')),
    ],
)
def test_the_reason_names_the_deciding_setting(settings, kind, expected):
    got = decide_action(GuardSettings.from_dict(settings), kind, 0, 0, True)
    assert got == expected


@pytest.mark.parametrize('kind', ['nonfinite_weights', '', None, 3])
def test_an_unknown_kind_is_refused_by_name(kind):
    with pytest.raises(ValueError) as info:
        decide_action(GuardSettings(), kind, 0, 0, True)
    message = str(info.value)
    assert message.startswith(f'nanguard: incident kind {kind!r} is unknown')
    for known in IncidentKind:
        assert repr(known.value) in message


def _snapshot(iteration):
    return TrainingSnapshot(iteration=iteration, model={}, optimizer={})


def test_snapshot_store_goes_further_back_when_a_rollback_failed():
    store = SnapshotStore(maxlen=2)
    assert store.newest is None and len(store) == 0
    for i in (10, 20, 30):
        store.add(_snapshot(i))
    assert [s.iteration for s in store] == [20, 30]
    assert store.for_rollback().iteration == 30
    # the incident came back before a new snapshot: go one further back
    assert store.for_rollback().iteration == 20
    # never beyond the oldest one
    assert store.for_rollback().iteration == 20
    store.add(_snapshot(40))
    assert store.for_rollback().iteration == 40
