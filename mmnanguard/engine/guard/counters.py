# Copyright (c) mmnanguard contributors. All rights reserved.
"""The guard's counters: their names, and the checked load of saved ones."""

from typing import Any, Dict

from .state_checks import count_at, state_dict_at

#: Counters published through the MessageHub as ``train/nanguard_<name>``
#: and saved in checkpoints under ``nanguard``. None contains ``loss``,
#: ``time`` or ``grad_norm``: ``LogProcessor`` would average those over its
#: window instead of showing the current count.
COUNTERS = (
    'incidents',
    'skipped',
    'rollbacks',
    'nonfinite_objective',
    'nonfinite_grad',
    'nonfinite_params',
    'nonfinite_buffers',
    'poisoned_checkpoints',
    'amp_skipped',
    'spikes',
    'vetoed',
    'lr_backoffs',
)


def checked_counters(saved: Any) -> Dict[str, int]:
    """The counters of a checkpoint's ``nanguard.counters``, each checked
    (:mod:`.state_checks`); names the guard does not count are ignored.

    Raises:
        GuardStateError: A value is not a count (negative, NaN, not an
            integer).
    """
    saved = state_dict_at(saved, 'counters')
    return {
        name: count_at(saved[name], f'counters.{name}')
        for name in COUNTERS
        if name in saved
    }
