# Copyright (c) mmnanguard contributors. All rights reserved.
"""What one optimizer step's single host read told the guard."""

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Protocol, Tuple

from torch import Tensor

from ..incident import json_number
from .spike_detector import Spike


class GradHolder(Protocol):
    """What the guard reads of a parameter: its ``.grad`` (a parameter's,
    or a ZeRO partition's gradient)."""

    @property
    def grad(self) -> Optional[Tensor]: ...


@dataclass
class AmpStep:
    """The GradScaler around one step, from the guard's read (the scale
    after the step follows from the GradScaler's update rule).

    Args:
        scale_before (float): The loss scale the gradients carried.
        scale_after (float): The scale after ``update``.
        tracker_before (int): Consecutive unskipped steps before.
        tracker_after (int): And after.
        found_inf (bool): The GradScaler found inf/NaN gradients.
    """

    scale_before: float
    scale_after: float
    tracker_before: int
    tracker_after: int
    found_inf: bool

    @property
    def skipped(self) -> bool:
        """The GradScaler skipped this step."""
        return self.found_inf


@dataclass
class StepVerdict:
    """One optimizer step, as the host read it (once).

    The ``*_finite`` verdicts are agreed by all ranks; ``local_*`` says
    what this rank saw itself.

    Args:
        iteration (int): The iteration of the step.
        loss_finite (bool): Every loss of the accumulation window was
            finite.
        loss_bad_iteration (int, optional): The first iteration of the
            window with a non-finite loss.
        grad_norm (float): The global gradient norm, before ``clip_grad``.
        grad_finite (bool): The gradient norm was finite (under AMP: the
            GradScaler found no inf).
        params_finite (bool, optional): The parameters after the previous
            step (and, for the first step, the buffers training starts
            from) were finite (None: not checked).
        params_iteration (int, optional): The iteration of that step.
        inputs_finite (bool, optional): The inputs and boxes after the
            data preprocessor were finite (None: not seen).
        buffers_finite (bool, optional): The floating buffers after the
            forward (BatchNorm statistics) were finite (None: the model
            has none).
        loss_terms (dict): ``parse_losses``' log vars as floats.
        spikes (list[Spike]): Quantities above their running max.
        amp (AmpStep, optional): The GradScaler's side of the step.
        local_loss_finite (bool): This rank's own loss verdict.
        local_grad_finite (bool): This rank's own gradient verdict.
        veto (str, optional): Why an extension's veto dropped the step.
    """

    iteration: int
    loss_finite: bool = True
    loss_bad_iteration: Optional[int] = None
    grad_norm: Optional[float] = None
    grad_finite: bool = True
    params_finite: Optional[bool] = None
    params_iteration: Optional[int] = None
    inputs_finite: Optional[bool] = None
    buffers_finite: Optional[bool] = None
    loss_terms: Dict[str, float] = field(default_factory=dict)
    spikes: List[Spike] = field(default_factory=list)
    spike_acts: bool = False
    amp: Optional[AmpStep] = None
    local_loss_finite: bool = True
    local_grad_finite: bool = True
    local_params_finite: Optional[bool] = None
    veto: Optional[str] = None
    #: The step guard's votes, agreed by all ranks (``StepGuard.votes``).
    votes: Dict[str, bool] = field(default_factory=dict)
    #: ``(found_inf, scale, growth tracker)`` read from the GradScaler.
    amp_raw: Optional[Tuple[bool, float, int]] = None
    #: Per-parameter gradient norms (device, before clipping), read only
    #: for a report; and the parameters they belong to.
    grad_norms: Optional[Tensor] = field(default=None, repr=False)
    #: The global gradient norm on the device (what ``clip_grad`` uses).
    grad_total: Optional[Tensor] = field(default=None, repr=False)
    grad_params: List[GradHolder] = field(default_factory=list, repr=False)
    #: The buffers the forward made non-finite, restored to their values
    #: before it (this rank's names).
    restored_buffers: List[str] = field(default_factory=list)
    #: A numerical routine's exception that ended the iteration
    #: (``'LinAlgError: ...'``), on a batch whose data checks failed; and
    #: the stage it was raised in.
    exception: Optional[str] = None
    exception_stage: Optional[str] = None

    @property
    def params_bad(self) -> bool:
        """The previous step made the weights non-finite."""
        return self.params_finite is False

    @property
    def buffers_bad(self) -> bool:
        """The forward made a buffer non-finite (restored since)."""
        return self.buffers_finite is False

    @property
    def vetoed(self) -> bool:
        """A spike (under ``skip``/``rollback``) or a veto drops it."""
        return bool(self.spikes and self.spike_acts) or self.veto is not None

    @property
    def guard_drops(self) -> bool:
        """The guard drops this step: the weights are already non-finite,
        a loss or a buffer the forward wrote was, or a spike or veto
        acts."""
        return (
            self.params_bad
            or not self.loss_finite
            or self.buffers_bad
            or self.vetoed
        )

    def allows_step(self) -> bool:
        """Whether the optimizer may step. Under AMP, non-finite gradients
        of a finite loss are the GradScaler's to skip, not an incident."""
        if self.guard_drops:
            return False
        return self.amp_raw is not None or self.grad_finite

    def top_grad_params(
        self, names: Dict[int, str], k: int
    ) -> List[Dict[str, Any]]:
        """The ``k`` parameters with non-finite or largest gradient norms
        (measured before ``clip_grad``); one host read, on incidents only.

        Args:
            names (dict): ``id(param) -> name``.
            k (int): How many.

        Returns:
            list[dict]: ``name`` and ``grad_norm`` (a float, or ``'nan'`` /
            ``'inf'``), non-finite first, then by decreasing norm.
        """
        if self.grad_norms is None or not self.grad_params:
            return []
        norms = self.grad_norms.tolist()
        order = sorted(
            range(len(norms)),
            key=lambda i: (
                math.isfinite(norms[i]),
                -norms[i] if math.isfinite(norms[i]) else 0.0,
            ),
        )
        return [
            dict(
                name=names.get(id(self.grad_params[i]), f'param[{i}]'),
                grad_norm=json_number(norms[i]),
            )
            for i in order[:k]
        ]


@dataclass
class IterationOutcome:
    """Everything the guard's steps decided in one iteration.

    Args:
        iteration (int): The iteration.
        verdicts (list[StepVerdict]): One per optimizer step (none in an
            accumulation iteration that does not step).
        steps (int): Steps taken.
        skipped (int): Steps dropped by the guard.
        amp_skipped (int): Steps the GradScaler skipped.
    """

    iteration: int = -1
    verdicts: List[StepVerdict] = field(default_factory=list)
    steps: int = 0
    skipped: int = 0
    amp_skipped: int = 0

    @property
    def last(self) -> Optional[StepVerdict]:
        """The verdict of the iteration's last step."""
        return self.verdicts[-1] if self.verdicts else None

    def loss_scale(self) -> Optional[float]:
        """The AMP loss scale after the last step."""
        amp = [v.amp for v in self.verdicts if v.amp is not None]
        return amp[-1].scale_after if amp else None
