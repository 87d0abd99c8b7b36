# Copyright (c) mmnanguard contributors. All rights reserved.
"""The guard inside the optimizer wrapper: one host read per step.

Every check of an iteration is a tensor on the device until the optimizer is
about to step: whether the inputs after the data preprocessor were finite, each
loss term and the total loss of every micro-batch of the accumulation window,
the global gradient norm (and, for a report only, the norm of every parameter's
gradient, taken before ``clip_grad`` scales them), whether the parameters were
finite after the previous step, whether the buffers the forward wrote
(BatchNorm statistics) are finite (a non-finite one is put back to its value
before the forward: :mod:`.forward_buffers`), the spike detector's flags and,
under AMP, the GradScaler's ``found_inf``, scale and growth tracker.
:meth:`StepGuard.read` stacks them into one vector and reads it on the host
once (``.tolist()``); under ``torch.distributed`` the flags that decide are
summed over the ranks by one ``all_reduce`` before that read, so every rank
takes the same decision. The norm of sharded gradients (FSDP2) travels in the
same ``all_reduce``, each rank's share of it summed with the flags
(:mod:`.grad_norm`); the spike detector then checks that norm after the
``all_reduce``, the losses before it (their flags are voted). With
``clip_grad`` the read happens inside the clip function and returns the norm as
a Python float, so mmengine's own ``float(grad_norm)`` for the log costs
nothing: the guard adds no read.

Backward always runs: a non-finite loss gives non-finite gradients, which
the verdict catches before the step (and no rank skips a collective).
"""

import math
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import torch
from mmengine import dist
from torch import Tensor

from mmnanguard.compat.grad_scaler_state import amp_state

from .agreed_flags import AgreedFlags
from .dtensor import local
from .forward_buffers import ForwardBuffers
from .grad_norm import GradNorm, grad_norm
from .loss_window import LossWindow, as_read_scalar, read_dtype
from .params_check import ParamsCheck
from .read_decoding import decode_read
from .spike_detector import SpikeCheck, SpikeDetector
from .verdict import GradHolder, IterationOutcome, StepVerdict

#: A veto looks at a step's verdict and returns the reason to drop the
#: update, or None. It runs on the host after the read, so it must decide
#: from the verdict alone (which all ranks share) to keep ranks in step.
Veto = Callable[[StepVerdict], Optional[str]]


class StepGuard:
    """Checks every optimizer step with one host read.

    One instance serves every optimizer wrapper of a runner (see
    :mod:`mmnanguard.engine.optimizers.guarded_optim_wrapper`). The hook
    calls :meth:`begin_iteration` before each iteration and reads
    :attr:`outcome` after it.

    Args:
        named_params (dict): ``id(param) -> name``, for attribution.
        buffers (Mapping[str, Tensor]): The model's named buffers, saved
            before each forward and checked before the step (BatchNorm
            statistics).
        top_k_grads (int): Parameters reported on a gradient incident.
        spike_detector (SpikeDetector, optional): Joins the read.
        param_check_interval (int): Check the parameters after every this
            many steps (0: only when a snapshot is due).
    """

    def __init__(
        self,
        named_params: Dict[int, str],
        buffers: Optional[Mapping[str, Tensor]] = None,
        top_k_grads: int = 10,
        spike_detector: Optional[SpikeDetector] = None,
        param_check_interval: int = 1,
    ) -> None:
        self.named_params = named_params
        self.top_k_grads = top_k_grads
        self.spike_detector = spike_detector
        #: The queued check of the parameters after a step.
        self.params_check = ParamsCheck(param_check_interval)
        #: The buffers the forward writes, saved before it.
        self.forward_buffers = ForwardBuffers(dict(buffers or {}))
        self.vetoes: List[Veto] = []
        #: Host flags that travel in the read (and its ``all_reduce``):
        #: ``name -> callable returning this rank's bool``; the verdict's
        #: ``votes[name]`` is True when any rank's was (e.g. a preemption
        #: signal).
        self.votes: Dict[str, Callable[[], bool]] = {}
        self.iteration = -1
        self.outcome = IterationOutcome()
        #: Force a parameter check after this iteration's step (a snapshot
        #: of the state after it is due).
        self.check_params_after_step = False
        self._inputs_flag: Optional[Tensor] = None
        self._loss_terms: Dict[str, Any] = {}
        self._windows: Dict[int, LossWindow] = {}
        self._params_seen: Optional[tuple] = None
        self._steps = 0

    # -- what the iteration produced (no host reads) -----------------------
    def begin_iteration(self, iteration: int) -> None:
        """Start iteration ``iteration``: save the buffers before the
        forward of an accumulation window's first micro-batch."""
        if not self._windows:
            self.forward_buffers.save()
        self.iteration = iteration
        self.outcome = IterationOutcome(iteration)
        self.check_params_after_step = False
        self._inputs_flag = None
        self._loss_terms = {}
        self._steps = 0
        self._params_seen = None

    def note_inputs(self, flag: Optional[Tensor]) -> None:
        """The inputs' finiteness flag (0-dim bool) of this iteration."""
        self._inputs_flag = flag

    def note_loss_terms(self, log_vars: Dict[str, Any]) -> None:
        """``parse_losses``' log vars of this iteration."""
        self._loss_terms = log_vars

    def note_loss(self, owner: object, loss: Tensor) -> None:
        """The loss ``owner`` (an optim wrapper) runs backward on."""
        self._windows[id(owner)] = LossWindow.extended(
            self._windows.get(id(owner)), loss, self.iteration
        )

    # -- the read ----------------------------------------------------------
    def read(
        self,
        owner: object,
        params: Sequence[GradHolder],
        norm_type: float = 2.0,
        scaler: Any = None,
        optimizer: Optional[torch.optim.Optimizer] = None,
    ) -> StepVerdict:
        """Decide one step of ``owner`` with one host read.

        Args:
            owner (object): The optim wrapper about to step.
            params (Sequence[GradHolder]): Its parameters (what has a
                ``.grad``).
            norm_type (float): The norm of the gradient norm (``clip_grad``'s
                ``norm_type``). Defaults to 2.
            scaler (GradScaler, optional): An enabled GradScaler that has
                unscaled ``optimizer``'s gradients.
            optimizer (Optimizer, optional): The optimizer of ``scaler``.

        Returns:
            StepVerdict: The verdict, agreed by all ranks.
        """
        grad_params = [p for p in params if p.grad is not None]
        grads = [p.grad for p in grad_params if p.grad is not None]
        window = self._windows.pop(id(owner), None)
        device = self._device(grads, window)
        dtype = read_dtype(device)
        zero = torch.zeros((), device=device, dtype=dtype)
        norm: Optional[GradNorm] = None
        # folded: this rank's share of the norm (the total is None)
        power: Optional[Tensor] = None
        if grads:
            # sharded gradients: folded into the all_reduce below
            norm = grad_norm(grads, norm_type, dtype)
            norms, total, power = norm.norms, norm.total, norm.power
        else:
            norms, total = None, zero
        folded = power is not None
        # the total first; a folded one is put in after the all_reduce
        parts: List[Tensor] = [
            zero.reshape(1)
            if total is None
            else as_read_scalar(total, device).reshape(1)
        ]
        layout: Dict[str, slice] = {}

        def add(name: str, values: Any) -> None:
            """Append a list of 0-dim tensors, or a 1-dim tensor."""
            if isinstance(values, Tensor):
                values = values.detach().to(device, dtype).reshape(-1)
            else:
                values = torch.stack(
                    [as_read_scalar(v, device) for v in values]
                )
            start = sum(p.numel() for p in parts)
            parts.append(values)
            layout[name] = slice(start, start + values.numel())

        if window is not None:
            loss_bad, first_bad = window.bad, window.first_bad
        elif isinstance(self._loss_terms.get('loss'), Tensor):
            # no backward through the wrapper: the logged total decides
            loss_bad = ~torch.isfinite(self._loss_terms['loss'].detach())
            first_bad = zero + self.iteration
        else:
            loss_bad, first_bad = zero, zero - 1
        add('loss', [loss_bad, first_bad])
        params_flag, params_iteration = self.params_check.take()
        if params_flag is not None:
            add('params', [params_flag])
        if self._inputs_flag is not None:
            add('inputs', [self._inputs_flag])
        buffers_flag = self.forward_buffers.flag()
        if buffers_flag is not None:
            add('buffers', [buffers_flag])
        if power is not None:
            local_grad_bad = ~torch.isfinite(power)
            add('local_grad', local_grad_bad)
        terms = {
            k: v
            for k, v in self._loss_terms.items()
            if isinstance(v, Tensor) and v.numel() == 1
        }
        if terms:
            add('terms', list(terms.values()))
        amp = amp_state(scaler, optimizer) if scaler else None
        if amp is not None:
            add('amp', list(amp))
        check: Optional[SpikeCheck] = None
        detector = self.spike_detector
        suffix = f'#{self._steps}' if self._steps else ''
        checks_grad = amp is None and bool(grad_params)
        if detector is not None:
            values = detector.loss_values(
                window.last if window else None, self._loss_terms, suffix
            )
            # folded: the losses now (their flags are voted), the norm
            # after the all_reduce (a NaN keeps its row, unchecked)
            grad = (
                (zero + math.nan if folded else total) if checks_grad else None
            )
            check = detector.check(values, grad, suffix)
        names = list(self.votes)
        if names:
            add(
                'votes',
                [
                    torch.full((), float(bool(self.votes[n]())), device=device)
                    for n in names
                ],
            )
        if dist.get_world_size() > 1:
            votes = AgreedFlags(
                loss=as_read_scalar(loss_bad, device),
                grad=(
                    local_grad_bad if total is None else ~torch.isfinite(total)
                ).to(dtype),
                params=as_read_scalar(params_flag, device)
                if params_flag is not None
                else zero,
                buffers=as_read_scalar(buffers_flag, device)
                if buffers_flag is not None
                else zero,
                spike=check.flags.any().to(dtype)
                if check is not None
                else zero,
                amp_inf=as_read_scalar(amp[0], device)
                if amp is not None
                else zero,
            ).to_list()
            if names:
                votes.append(parts[-1].reshape(-1).to(dtype))
            if power is not None:
                votes.append(power)
            agreed = torch.cat([v.reshape(-1) for v in votes])
            dist.all_reduce(agreed, op='sum')
            add('agreed', agreed)
            if norm is not None and power is not None:  # folded
                total = norm.unfold(AgreedFlags.tail(agreed, len(names)))
                parts[0] = as_read_scalar(local(total), device).reshape(1)
                if detector is not None and checks_grad:
                    later = detector.check(
                        {},
                        local(total),
                        suffix,
                        AgreedFlags.view(agreed).spike > 0,
                    )
                    # ``later`` is a check of the norm, so ``check`` is one
                    if later is not None and check is not None:
                        check = check.merged(later, 'grad_norm' + suffix)
        if check is not None:
            add('spike_flags', check.flags)
            add('spike_values', check.values)
            add('spike_refs', check.references)
        host = torch.cat([p.reshape(-1) for p in parts]).tolist()
        self._steps += 1
        verdict = decode_read(
            host,
            layout,
            iteration=self.iteration,
            terms=terms,
            check=check,
            detector=self.spike_detector,
            vote_names=list(self.votes),
            params_iteration=params_iteration,
            norms=norms,
            grad_params=grad_params,
        )
        verdict.grad_total = total
        return self._settled(verdict)

    def _settled(self, verdict: StepVerdict) -> StepVerdict:
        """``verdict`` with the guard's state put in: the parameter check
        another wrapper read, the buffers restored, the vetoes."""
        if verdict.params_finite is not None:
            seen = (verdict.params_finite, verdict.params_iteration)
            self._params_seen = seen
        elif self._params_seen is not None:  # another wrapper's read
            verdict.params_finite, verdict.params_iteration = self._params_seen
        if verdict.buffers_finite is False:
            verdict.restored_buffers = self.forward_buffers.restore()
        reasons = [r for r in (v(verdict) for v in self.vetoes) if r]
        if reasons:
            verdict.veto = '; '.join(reasons)
        self.outcome.verdicts.append(verdict)
        return verdict

    @staticmethod
    def _device(
        grads: List[Tensor], window: Optional[LossWindow]
    ) -> torch.device:
        if window is not None:
            return window.last.device
        if grads:
            return grads[0].device
        return torch.device('cpu')

    # -- after the step ----------------------------------------------------
    def after_step(
        self, params: Sequence[Tensor], stepped: bool, amp_skip: bool = False
    ) -> None:
        """Count the step in :attr:`outcome`; queue the parameter check
        when it is due.

        Args:
            params (Sequence[Tensor]): The wrapper's parameters.
            stepped (bool): Whether the optimizer stepped.
            amp_skip (bool): The step was not taken because the GradScaler
                found an inf (not the guard's decision). Defaults to False.
        """
        if stepped:
            self.outcome.steps += 1
        elif amp_skip:
            self.outcome.amp_skipped += 1
        else:
            self.outcome.skipped += 1
        if stepped and (
            self.params_check.due(self.iteration)
            or self.check_params_after_step
        ):
            self.params_check.queue(params, self.iteration)

    def check_initial_params(self, params: Sequence[Tensor]) -> None:
        """Queue a check of the parameters training starts from (read with
        the first step, as the check of the step before it)."""
        self.params_check.queue(
            list(params) + self.forward_buffers.floating, self.iteration - 1
        )

    def drop_raised_iteration(self, exception: str, stage: str) -> None:
        """Record this iteration as a step dropped because a numerical
        routine raised in it (no read: the verdict is the exception's):
        the buffers the forward wrote are restored and an open
        accumulation window is closed.

        Args:
            exception (str): ``'<type>: <message>'``.
            stage (str): Where it was raised (``forward``, ``loss`` or
                ``backward``).
        """
        restored = self.forward_buffers.restore()
        self._windows.clear()
        flag = self._inputs_flag  # one read, on an incident only
        self.outcome.verdicts.append(
            StepVerdict(
                iteration=self.iteration,
                inputs_finite=None if flag is None else bool(flag),
                loss_finite=False,
                loss_bad_iteration=self.iteration,
                local_loss_finite=False,
                restored_buffers=restored,
                exception=exception,
                exception_stage=stage,
            )
        )
        self.outcome.skipped += 1

    def forget_pending(self) -> None:
        """Drop what was queued for the next read (after a rollback
        restored a known-good state)."""
        self.params_check.forget()
        self._windows.clear()
