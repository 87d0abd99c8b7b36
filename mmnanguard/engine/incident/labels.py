# Copyright (c) mmnanguard contributors. All rights reserved.
"""The words a report uses for what the guard did (``action``), where the
first non-finite value was seen (``stage``) and why (``cause``).

Each is a ``str`` enum: a member compares equal to the string that
``report.json`` stores (``IncidentAction.SKIP == 'skip'``), prints as it
(``f'{action}'`` gives ``skip``) and is written to JSON as it, so a report
read back from disk (plain strings) and a live one (members) read alike.
"""

from enum import Enum
from typing import Optional, Type, TypeVar

L = TypeVar('L', bound='ReportLabel')


class ReportLabel(str, Enum):
    """A ``str`` enum that prints as its value."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def coerce(cls: Type[L], value: object, field: str) -> Optional[L]:
        """``value`` as a member (None stays None).

        Raises:
            ValueError: Naming the field, the value and the members.
        """
        if value is None:
            return None
        try:
            return cls(value)
        except ValueError:
            raise ValueError(
                f'nanguard: {field}={value!r} is not one of '
                f'{[m.value for m in cls]}'
            ) from None


class IncidentAction(ReportLabel):
    """What the guard did about an incident."""

    #: The update was dropped; training goes on from the same weights.
    SKIP = 'skip'
    #: A known-good state was restored and the lrs backed off.
    ROLLBACK = 'rollback'
    #: Training stopped (:class:`NonFiniteTrainingError`, exit 3).
    RAISE = 'raise'


class Stage(ReportLabel):
    """Where, in the order the iteration runs, the first non-finite value
    was seen (see :mod:`mmnanguard.engine.guard.stage`)."""

    DATA = 'data'
    FORWARD = 'forward'
    LOSS = 'loss'
    BACKWARD = 'backward'
    OPTIMIZER = 'optimizer'
    CHECKPOINT = 'checkpoint'


class Cause(ReportLabel):
    """What the diagnosis found behind an incident (see
    :mod:`mmnanguard.engine.diagnosis.classify`)."""

    #: Invalid data in the batch made the replay non-finite.
    DATA = 'data'
    #: The replay of the batch is finite: the fault did not come back.
    TRANSIENT = 'transient'
    #: The gradient norm, the loss or the lr grew by orders of magnitude.
    EXPLOSION = 'explosion'
    #: A module's output went non-finite from finite inputs.
    FORWARD = 'forward'
    #: A loss term went non-finite from finite predictions.
    LOSS = 'loss'
    #: The loss was finite, its gradient was not.
    BACKWARD = 'backward'
    #: The gradients were finite, the optimizer state was not.
    OPTIMIZER = 'optimizer'
    #: The replay of the batch is finite, but the same samples gave the
    #: same incident before: never a one-shot fault.
    RECURRING = 'recurring'
