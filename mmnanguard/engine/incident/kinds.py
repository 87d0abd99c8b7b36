# Copyright (c) mmnanguard contributors. All rights reserved.
"""The kinds of incident the guard records, in one place."""

from typing import Optional

from .labels import ReportLabel


class IncidentKind(ReportLabel):
    """What went wrong in one iteration (or checkpoint).

    The value is what ``report.json`` stores under ``kind``; a member
    compares equal to it (``IncidentKind.NONFINITE_LOSS ==
    'nonfinite_loss'``).
    """

    #: A loss term or the total loss was NaN or infinite.
    NONFINITE_LOSS = 'nonfinite_loss'
    #: The loss was finite, the gradient norm was not.
    NONFINITE_GRAD = 'nonfinite_grad'
    #: The parameters or buffers were non-finite after an optimizer step.
    NONFINITE_PARAMS = 'nonfinite_params'
    #: The forward wrote non-finite buffers (BatchNorm statistics); they
    #: were restored to their values before it.
    NONFINITE_BUFFERS = 'nonfinite_buffers'
    #: A checkpoint about to be written held non-finite state.
    NONFINITE_CHECKPOINT = 'nonfinite_checkpoint'
    #: A loss term spiked (``spike=dict(...)``).
    LOSS_SPIKE = 'loss_spike'
    #: The gradient norm spiked.
    GRAD_SPIKE = 'grad_spike'
    #: Another extension's veto dropped a finite update.
    VETOED_UPDATE = 'vetoed_update'

    @property
    def counter(self) -> str:
        """The ``train/nanguard_<counter>`` this kind increments."""
        return _COUNTERS[self]

    @property
    def is_spike(self) -> bool:
        """A finite value far above its running max."""
        return self in (IncidentKind.LOSS_SPIKE, IncidentKind.GRAD_SPIKE)

    @property
    def is_veto(self) -> bool:
        """A finite update that a check dropped (spikes and vetoes); it
        follows ``spike.action`` rather than ``policy``."""
        return self.is_spike or self is IncidentKind.VETOED_UPDATE

    @property
    def weights_damaged(self) -> bool:
        """The weights are already non-finite: a skip cannot help."""
        return self in (
            IncidentKind.NONFINITE_PARAMS,
            IncidentKind.NONFINITE_CHECKPOINT,
        )

    @classmethod
    def parse(cls, value: object) -> Optional['IncidentKind']:
        """The member whose value is ``value``, or None."""
        try:
            return cls(value)
        except ValueError:
            return None


_COUNTERS = {
    IncidentKind.NONFINITE_LOSS: 'nonfinite_objective',
    IncidentKind.NONFINITE_GRAD: 'nonfinite_grad',
    IncidentKind.NONFINITE_PARAMS: 'nonfinite_params',
    IncidentKind.NONFINITE_BUFFERS: 'nonfinite_buffers',
    IncidentKind.NONFINITE_CHECKPOINT: 'poisoned_checkpoints',
    IncidentKind.LOSS_SPIKE: 'spikes',
    IncidentKind.GRAD_SPIKE: 'spikes',
    IncidentKind.VETOED_UPDATE: 'vetoed',
}
