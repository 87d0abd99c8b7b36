# Copyright (c) mmnanguard contributors. All rights reserved.
"""Which incident a step's verdict shows, and which iteration it blames."""

from typing import Optional

from ..incident import IncidentKind
from .verdict import IterationOutcome, StepVerdict


def incident_kind(verdict: Optional[StepVerdict]) -> Optional[IncidentKind]:
    """The incident a step's verdict shows, or None for a healthy step (a
    GradScaler skip and a logged spike are not incidents)."""
    if verdict is None:
        return None
    if verdict.params_bad:
        return IncidentKind.NONFINITE_PARAMS
    # the forward runs before the loss: its buffers name the incident
    # unless the inputs were non-finite already
    if verdict.buffers_bad and verdict.inputs_finite is not False:
        return IncidentKind.NONFINITE_BUFFERS
    if not verdict.loss_finite:
        return IncidentKind.NONFINITE_LOSS
    if not verdict.grad_finite and verdict.amp is None:
        return IncidentKind.NONFINITE_GRAD
    if verdict.buffers_bad:
        return IncidentKind.NONFINITE_BUFFERS
    if verdict.spike_acts and (verdict.spikes or verdict.veto):
        grad_only = verdict.spikes and all(
            s.stage == 'grad' for s in verdict.spikes
        )
        return (
            IncidentKind.GRAD_SPIKE if grad_only else IncidentKind.LOSS_SPIKE
        )
    if verdict.veto is not None:
        return IncidentKind.VETOED_UPDATE
    return None


def deciding_verdict(outcome: IterationOutcome) -> Optional[StepVerdict]:
    """The verdict of the iteration that decides (an incident first)."""
    for verdict in outcome.verdicts:
        if incident_kind(verdict) is not None:
            return verdict
    return outcome.last


def bad_iteration(
    kind: IncidentKind, verdict: Optional[StepVerdict], current: int
) -> int:
    """The iteration whose update was bad: the step before a failed
    parameter check, the micro-batch with the first non-finite loss."""
    if verdict is None:
        return current
    if kind is IncidentKind.NONFINITE_PARAMS:
        if verdict.params_iteration is not None:
            return verdict.params_iteration
        return current
    if (
        kind is IncidentKind.NONFINITE_LOSS
        and verdict.loss_bad_iteration is not None
    ):
        return verdict.loss_bad_iteration
    return current
