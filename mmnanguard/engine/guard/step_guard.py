# Copyright (c) mmnanguard contributors. All rights reserved.
"""The decisions taken inside the optimizer wrapper, before any step."""

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import torch

from .distributed import any_rank
from .finite import top_grad_norms


@dataclass
class IterationRecord:
    """What the guard saw during one training iteration.

    ``loss_nonfinite`` and ``grad_nonfinite`` are the verdicts all ranks
    agreed on; the ``local_`` fields say whether this rank saw it itself.
    """

    loss_nonfinite: bool = False
    local_loss_nonfinite: bool = False
    grad_nonfinite: bool = False
    local_grad_nonfinite: bool = False
    grad_norm: Optional[float] = None
    steps: int = 0
    skipped_steps: int = 0
    amp_skipped_steps: int = 0
    loss_scale: Optional[float] = None
    amp_scale_change: Optional[tuple] = None
    top_grad_params: List[Dict[str, Any]] = field(default_factory=list)
    #: ``log_vars`` of ``parse_losses`` (tensors), captured before backward.
    loss_terms: Dict[str, Any] = field(default_factory=dict)
    #: Why a veto (e.g. a loss spike) dropped this iteration's update.
    veto: Optional[str] = None
    #: Which check vetoed: ``'loss'`` or ``'grad'``.
    veto_stage: Optional[str] = None
    #: Finiteness of the inputs and targets after the data preprocessor, a
    #: 0-dim tensor not yet read (see ``guard/input_check.py``).
    inputs_flag: Optional[torch.Tensor] = None
    #: ``inputs_flag`` read on the host (with the loss check), or None.
    inputs_finite: Optional[bool] = None

    def read_inputs_flag(self) -> Optional[bool]:
        """``inputs_finite``, reading ``inputs_flag`` when the loss check
        did not (e.g. a parameter incident of a model without a loss
        check)."""
        if self.inputs_finite is None and self.inputs_flag is not None:
            self.inputs_finite = bool(self.inputs_flag)
        return self.inputs_finite


#: A veto inspects the record (and the loss or grad norm) and returns the
#: reason to drop the update, or None.
Veto = Callable[[IterationRecord, float], Optional[str]]


class StepGuard:
    """Checks the loss before backward and the gradients before each step.

    One instance serves every optimizer wrapper of a runner (see
    :func:`mmnanguard.engine.optimizers.install_step_guard`). Each check
    costs one host sync (and, under DDP, one ``all_reduce`` of a flag).

    Args:
        named_params (dict): ``id(param) -> name``, for attribution.
        top_k_grads (int): Parameters reported on a gradient incident.
    """

    def __init__(self, named_params: Dict[int, str], top_k_grads: int = 10):
        self.named_params = named_params
        self.top_k_grads = top_k_grads
        self.record = IterationRecord()
        #: Vetoes run on a finite total loss before backward, and on a
        #: finite gradient norm before the step (e.g. spike detectors).
        self.loss_vetoes: List[Veto] = []
        self.grad_vetoes: List[Veto] = []

    def begin_iteration(self) -> None:
        """Start a fresh :class:`IterationRecord`."""
        self.record = IterationRecord()

    def loss_is_finite(self, loss: torch.Tensor) -> bool:
        """Whether backward may run on ``loss`` (agreed by all ranks).

        The inputs' finiteness flag of the iteration is read in the same
        host transfer (it costs no extra sync).
        """
        flags = [torch.isfinite(loss.detach()).all()]
        inputs = self.record.inputs_flag
        if inputs is not None:
            flags.append(inputs.to(flags[0].device))
        values = torch.stack(flags).tolist()
        if inputs is not None:
            self.record.inputs_finite = bool(values[1])
        local_bad = not values[0]
        bad = any_rank(local_bad)
        self.record.local_loss_nonfinite |= local_bad
        self.record.loss_nonfinite |= bad
        if bad or not self.loss_vetoes:
            return not bad
        return not self._vetoed('loss', self.loss_vetoes, float(loss.detach()))

    def _vetoed(self, stage: str, vetoes: List[Veto], value: float) -> bool:
        if not vetoes:
            return False
        reasons = [r for r in (v(self.record, value) for v in vetoes) if r]
        if not any_rank(bool(reasons)):
            return False
        self.record.veto = '; '.join(reasons) or 'vetoed on another rank'
        self.record.veto_stage = stage
        return True

    def grad_norm_is_finite(
        self, norm: Any, optimizer: torch.optim.Optimizer
    ) -> bool:
        """Whether the optimizer may step with gradients of norm ``norm``.

        On a non-finite norm the parameters with the largest or non-finite
        gradients are recorded (before the caller zeroes them).
        """
        value = float(norm)
        local_bad = not math.isfinite(value)
        bad = any_rank(local_bad)
        self.record.grad_norm = value
        if bad:
            self.record.local_grad_nonfinite |= local_bad
            self.record.grad_nonfinite = True
            self.record.top_grad_params = top_grad_norms(
                self.named_params, optimizer, self.top_k_grads
            )
            return False
        return not self._vetoed('grad', self.grad_vetoes, value)

    def note_step(self) -> None:
        """An optimizer step was taken."""
        self.record.steps += 1

    def note_skipped_step(self) -> None:
        """An optimizer step was dropped because of a non-finite value."""
        self.record.skipped_steps += 1

    def note_amp_step(self, scale_before: float, scale_after: float) -> None:
        """A GradScaler step; it skipped exactly when the scale went down."""
        self.record.loss_scale = scale_after
        if scale_after < scale_before:
            self.record.amp_skipped_steps += 1
            self.record.amp_scale_change = (scale_before, scale_after)
        else:
            self.record.steps += 1
