# Copyright (c) mmnanguard contributors. All rights reserved.
"""Replay one training batch with every module probed."""

import copy
import math
import warnings
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

import torch
from mmengine.model import BaseModel
from torch import nn

from mmnanguard.compat.mmengine_private import run_forward

from ..guard.exceptions import (
    NUMERICAL_ERRORS,
    describe_error,
    raised_stage,
)
from ..guard.finite import json_number, total_norm
from ..guard.forward_buffers import nonfinite_buffers
from ..guard.rng import capture_rng_state, restore_rng_state
from .ctc_alignment import CtcProbe
from .magnitude import first_out_of_range, largest_outputs
from .probe import ActivationProbe


@dataclass
class ReplayResult:
    """What one replay of a batch saw.

    Attributes:
        precision (str): ``'fp32'``, ``'float16'`` or ``'bfloat16'``
            (autocast dtype).
        loss_scale (float | None): The loss was multiplied by it before
            backward (AMP), as the GradScaler does.
        loss_terms (dict): Every loss term (floats, ``'nan'``/``'inf'``).
        nonfinite_terms (list[str]): Terms that are not finite.
        forward_first (dict | None): See :class:`ActivationProbe`.
        loss_first (dict | None): See :class:`ActivationProbe`.
        grad_first (dict | None): See :class:`ActivationProbe`.
        param_grads (list[dict]): See :class:`ActivationProbe`.
        term_grads (dict): For a finite total loss with non-finite
            gradients: term -> whether its own gradient is finite.
        backward_ran (bool): Backward runs only on a finite total loss
            (the guard skips it otherwise).
        grad_norm (float | str | None): The global gradient norm after
            backward (it can overflow float32 while every element is
            finite; the guard then drops the step too).
        top_grads (list[dict]): The parameters with the largest gradient
            norms (name, norm).
        anomaly (str | None): ``detect_anomaly``'s error and the forward
            traceback of the failing op (``anomaly=True``).
        magnitude_first (dict | None): The first module call whose output
            left the normal range (:func:`first_out_of_range`).
        magnitude_top (list[dict]): The module calls with the largest
            outputs (:func:`largest_outputs`).
        nonfinite_buffers (list[str]): The floating buffers (BatchNorm
            statistics) non-finite after the forward.
        exception (str | None): A numerical routine's exception that ended
            the replay (``'LinAlgError: ...'``), and ``exception_stage``,
            where it was raised.
        ctc_unaligned (list[dict]): The samples a ``CTCLoss`` could not
            align (:func:`~.ctc_alignment.unaligned_samples`).
        ctc_error (str | None): Why a ``CTCLoss`` call could not be
            checked for them (its inputs were of a form the probe cannot
            read); None when every call was checked.
    """

    precision: str = 'fp32'
    loss_scale: Optional[float] = None
    loss_terms: Dict[str, Any] = field(default_factory=dict)
    nonfinite_terms: List[str] = field(default_factory=list)
    forward_first: Optional[Dict[str, Any]] = None
    loss_first: Optional[Dict[str, Any]] = None
    grad_first: Optional[Dict[str, Any]] = None
    param_grads: List[Dict[str, Any]] = field(default_factory=list)
    term_grads: Dict[str, bool] = field(default_factory=dict)
    backward_ran: bool = False
    grad_norm: Any = None
    top_grads: List[Dict[str, Any]] = field(default_factory=list)
    anomaly: Optional[str] = None
    magnitude_first: Optional[Dict[str, Any]] = None
    magnitude_top: List[Dict[str, Any]] = field(default_factory=list)
    nonfinite_buffers: List[str] = field(default_factory=list)
    exception: Optional[str] = None
    exception_stage: Optional[str] = None
    ctc_unaligned: List[Dict[str, Any]] = field(default_factory=list)
    ctc_error: Optional[str] = None

    @property
    def finite(self) -> bool:
        """Whether the loss, every activation, every buffer the forward
        wrote and every gradient was finite."""
        return not (
            self.nonfinite_terms
            or self.nonfinite_buffers
            or self.exception
            or self.forward_first
            or self.loss_first
            or self.grad_first
            or self.param_grads
            or self.anomaly
            or isinstance(self.grad_norm, str)
        )

    def to_dict(self) -> Dict[str, Any]:
        """JSON-ready form (with ``finite``)."""
        return dict(asdict(self), finite=self.finite)


def _json_safe(entry: Dict[str, Any]) -> Dict[str, Any]:
    """``entry`` with non-finite floats as ``'inf'``/``'nan'`` strings."""
    return {
        k: json_number(v) if isinstance(v, float) else v
        for k, v in entry.items()
    }


def _term_total(value: Any) -> Optional[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return value.mean()
    if (
        isinstance(value, (list, tuple))
        and value
        and all(isinstance(v, torch.Tensor) for v in value)
    ):
        return sum(v.mean() for v in value)
    return None


def _term_grads(
    losses: Dict[str, Any], params: List[nn.Parameter], scale: float
) -> Dict[str, bool]:
    out = {}
    for name, value in losses.items():
        total = _term_total(value)
        if 'loss' not in name or total is None or not total.requires_grad:
            continue
        grads = torch.autograd.grad(
            total * scale, params, retain_graph=True, allow_unused=True
        )
        out[name] = all(
            bool(torch.isfinite(g).all()) for g in grads if g is not None
        )
    return out


def replay_batch(
    model: BaseModel,
    data_batch: Dict[str, Any],
    rng_state: Optional[Dict[str, Any]] = None,
    autocast_dtype: Optional[torch.dtype] = None,
    loss_scale: Optional[float] = None,
    anomaly: bool = False,
) -> Dict[str, Any]:
    """Run ``train_step``'s forward, loss and backward on one batch, probed.

    The model is put in train mode and its gradients are set to None
    afterwards; the global RNG states are restored to what they were, so
    a replay does not change the course of training. No optimizer step is
    taken. BatchNorm running statistics change in a train-mode forward:
    :func:`replay_model` saves and restores them during training.

    Args:
        model (BaseModel): The (copied) model, in the state to replay from.
        data_batch (dict): The batch as the dataloader yielded it (it is
            deep-copied, not modified).
        rng_state (dict, optional): RNG states to start from
            (``batch.pth``'s ``rng_state``).
        autocast_dtype (torch.dtype, optional): Replay under
            ``torch.autocast`` with this dtype (AMP); None for fp32.
        loss_scale (float, optional): Multiply the loss by it before
            backward (the GradScaler's scale under AMP).
        anomaly (bool): Run under ``torch.autograd.detect_anomaly`` and
            record the failing op with its forward traceback.

    Returns:
        dict: ``result`` (:class:`ReplayResult`) and ``preprocessed`` (the
        data preprocessor's output, for the batch checks).
    """
    batch = copy.deepcopy(data_batch)
    saved = capture_rng_state()
    param = next(model.parameters(), None)
    device_type = param.device.type if param is not None else 'cpu'
    result = ReplayResult(
        precision=str(autocast_dtype).replace('torch.', '')
        if autocast_dtype is not None
        else 'fp32',
        loss_scale=loss_scale,
    )
    cast = (
        torch.autocast(device_type, dtype=autocast_dtype)
        if autocast_dtype is not None
        else nullcontext()
    )
    preprocessed = None
    try:
        if rng_state is not None:
            restore_rng_state(rng_state)
        model.train()
        model.zero_grad(set_to_none=True)
        with ActivationProbe(model) as probe, CtcProbe(
            model
        ) as ctc, warnings.catch_warnings(
            record=True
        ) as caught, torch.autograd.set_detect_anomaly(anomaly):
            warnings.simplefilter('always')
            try:
                with cast:
                    preprocessed = model.data_preprocessor(batch, True)
                    losses = run_forward(model)(preprocessed, mode='loss')
                result.nonfinite_buffers = nonfinite_buffers(
                    model.named_buffers()
                )
                loss, log_vars = BaseModel.parse_losses(model, losses)
                result.loss_terms = {
                    k: json_number(v) for k, v in log_vars.items()
                }
                result.nonfinite_terms = [
                    k
                    for k, v in log_vars.items()
                    if not math.isfinite(float(v))
                ]
                if not result.nonfinite_terms:
                    _backward(
                        model,
                        losses,
                        loss,
                        loss_scale or 1.0,
                        probe,
                        result,
                        anomaly,
                        caught,
                    )
            except NUMERICAL_ERRORS as err:  # a data fault that raises
                result.exception = describe_error(err)
                result.exception_stage = raised_stage(err).value
        result.forward_first = probe.forward_first
        result.loss_first = probe.loss_first
        result.grad_first = probe.grad_first
        result.param_grads = probe.param_grads
        result.ctc_unaligned = ctc.found
        result.ctc_error = ctc.error
        first = first_out_of_range(probe.magnitudes, result.precision)
        result.magnitude_first = None if first is None else _json_safe(first)
        result.magnitude_top = [
            _json_safe(m) for m in largest_outputs(probe.magnitudes)
        ]
    finally:
        model.zero_grad(set_to_none=True)
        restore_rng_state(saved)
    return dict(result=result, preprocessed=preprocessed)


def _backward(
    model: nn.Module,
    losses: Dict[str, Any],
    loss: torch.Tensor,
    scale: float,
    probe: ActivationProbe,
    result: ReplayResult,
    anomaly: bool,
    caught: list,
) -> None:
    result.backward_ran = True
    try:
        (loss * scale).backward(retain_graph=True)
    except RuntimeError as err:
        if not anomaly:
            raise
        trace = '\n'.join(
            str(w.message)
            for w in caught
            if 'Traceback of forward call' in str(w.message)
        )
        result.anomaly = f'{err}\n{trace}'.strip()
        return
    finally:
        probe.record_grads = False
    named = [
        (n, p.grad) for n, p in model.named_parameters() if p.grad is not None
    ]
    grads = [g for _, g in named]
    norms = [float(n) for n in torch._foreach_norm(grads)]
    result.grad_norm = json_number(total_norm(grads))
    order = sorted(
        range(len(named)),
        key=lambda i: -norms[i] if math.isfinite(norms[i]) else -math.inf,
    )
    result.top_grads = [
        dict(name=named[i][0], grad_norm=json_number(norms[i]))
        for i in order[:3]
    ]
    if probe.grad_first or probe.param_grads:
        params = [p for p in model.parameters() if p.requires_grad]
        result.term_grads = _term_grads(losses, params, scale)
