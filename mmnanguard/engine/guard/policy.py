# Copyright (c) mmnanguard contributors. All rights reserved.
"""What the guard does about one incident: ``raise``, ``skip`` or
``rollback``, and why."""

from typing import Tuple, Union

from ..incident import IncidentAction, IncidentKind
from .settings import GuardSettings


def decide_action(
    settings: GuardSettings,
    kind: Union[IncidentKind, str],
    consecutive_skips: int,
    rollbacks_used: int,
    has_known_good_state: bool,
) -> Tuple[IncidentAction, str]:
    """Choose the action for an incident of ``kind``.

    * Spikes and other vetoes follow ``settings.spike.action``, every other
      kind ``settings.policy``.
    * ``skip`` escalates to ``escalate_to`` when the parameters are already
      non-finite, or after ``max_consecutive_skips`` consecutive skips.
    * ``rollback`` becomes ``raise`` when ``max_rollbacks`` are spent or no
      known-good state exists.

    Args:
        settings (GuardSettings): The guard's settings.
        kind (IncidentKind | str): The incident kind.
        consecutive_skips (int): Skips since the last healthy step.
        rollbacks_used (int): Rollbacks done in this run.
        has_known_good_state (bool): Whether a snapshot or a good checkpoint
            exists.

    Returns:
        tuple[IncidentAction, str]: The action and the reason, for logs
        and reports.

    Raises:
        ValueError: For an unknown kind.
    """
    known = IncidentKind.parse(kind)
    if known is None:
        raise ValueError(
            f'nanguard: incident kind {kind!r} is unknown; expected one of '
            f'{[k.value for k in IncidentKind]}'
        )
    policy, label = settings.policy, 'policy'
    if known.is_veto:
        label = 'spike.action'
        policy = settings.spike.action if settings.spike else 'skip'
    if policy == 'raise':
        return IncidentAction.RAISE, f'{label}=raise'
    if policy == 'rollback':
        action, reason = IncidentAction.ROLLBACK, f'{label}=rollback'
    elif known.weights_damaged:
        action = IncidentAction(settings.escalate_to)
        reason = (
            'the parameters are already non-finite, a skip cannot undo the '
            f'step: escalate_to={settings.escalate_to}'
        )
    elif consecutive_skips >= settings.max_consecutive_skips:
        action = IncidentAction(settings.escalate_to)
        reason = (
            f'{consecutive_skips} consecutive skips reached '
            f'max_consecutive_skips={settings.max_consecutive_skips}: '
            f'escalate_to={settings.escalate_to}'
        )
    else:
        return IncidentAction.SKIP, f'{label}=skip'
    if action is IncidentAction.ROLLBACK:
        if rollbacks_used >= settings.max_rollbacks:
            return IncidentAction.RAISE, (
                f'{reason}, but max_rollbacks={settings.max_rollbacks} '
                'rollbacks are spent'
            )
        if not has_known_good_state:
            return IncidentAction.RAISE, (
                f'{reason}, but no known-good state exists'
            )
    return action, reason
