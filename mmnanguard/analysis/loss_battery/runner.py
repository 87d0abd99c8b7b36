# Copyright (c) mmnanguard contributors. All rights reserved.
"""Run a loss module through its battery: value and gradient of each case,
through a real backward pass (a ``torch.no_grad`` check misses the
``torch.where`` trap: a NaN in the branch that is not taken still flows
into the gradient)."""

import contextlib
import copy
import inspect
import math
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional

import torch
import torch.nn as nn
from torch import Tensor

from .case import BatteryContext, LossCase
from .kinds import KIND_CASES, KINDS, context_for, infer_kind

FINITE = 'finite'
REJECTED = 'rejected'
NOT_APPLICABLE = 'n/a'
NONFINITE_VALUE = 'non-finite value'
NONFINITE_GRAD = 'non-finite gradient'
ERROR = 'error'
#: Verdicts that pass.
PASSING = (FINITE, REJECTED, NOT_APPLICABLE)


@dataclass
class CaseResult:
    """The outcome of one case.

    ``value`` is the sum of the loss outputs and ``grad`` the largest
    absolute gradient entry of the predictions (None: not computed);
    ``message`` says what failed, was refused or did not apply.
    """

    path: str
    loss_type: str
    kind: str
    case: str
    group: str
    verdict: str
    value: Optional[float] = None
    grad: Optional[float] = None
    message: str = ''

    @property
    def passed(self) -> bool:
        """Whether the verdict passes."""
        return self.verdict in PASSING

    def to_dict(self) -> Dict[str, Any]:
        """The result as a JSON-ready dict."""
        return dict(asdict(self), passed=self.passed)


def _tensors(out: Any) -> List[Tensor]:
    """The tensors of a loss output (a tensor, a dict or a tuple)."""
    if isinstance(out, Tensor):
        return [out]
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        return [t for item in out for t in _tensors(item)]
    return []


def _fit_kwargs(
    loss: nn.Module, kwargs: Dict[str, Any]
) -> Optional[Dict[str, Any]]:
    """``kwargs`` that ``loss.forward`` accepts; None if one it needs is
    missing. ``ignore_index`` is optional (left out where not accepted)."""
    params = inspect.signature(loss.forward).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return kwargs
    if any(k not in params and k != 'ignore_index' for k in kwargs):
        return None
    return {k: v for k, v in kwargs.items() if k in params}


def _largest(values: List[Tensor]) -> float:
    """Largest absolute entry (nan or inf if any entry is non-finite)."""
    flat = [v.detach().double().flatten() for v in values if v.numel()]
    if not flat:
        return 0.0
    cat = torch.cat(flat)
    bad = cat[~torch.isfinite(cat)]
    if bad.numel():
        return float(bad[0])
    return float(cat.abs().max())


def _module_for(loss: nn.Module, case: LossCase) -> Optional[nn.Module]:
    """``loss``, or a copy with the case's ``loss_weight`` (None if the
    loss has none)."""
    if case.loss_weight is None:
        return loss
    if not isinstance(getattr(loss, 'loss_weight', None), (int, float)):
        return None
    variant = copy.deepcopy(loss)
    variant.loss_weight = case.loss_weight
    return variant


def _precision(args: List[Any], dtype: Optional[torch.dtype]) -> List[Any]:
    """Float tensors of ``args`` cast to ``dtype`` (leaves kept)."""
    if dtype is None:
        return args
    return [
        a.detach().to(dtype).requires_grad_(a.requires_grad)
        if isinstance(a, Tensor) and a.is_floating_point()
        else a
        for a in args
    ]


def _neutral_weights(loss: nn.Module, args: List[Any]) -> List[Any]:
    """Ones shaped like the prediction for each required positional
    argument of ``loss.forward`` beyond ``args`` (mmdet's ``GHMC`` and
    ``GHMR`` require ``label_weight``): the weight that changes nothing."""
    params = inspect.signature(loss.forward).parameters.values()
    required = [
        p
        for p in params
        if p.default is p.empty
        and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    missing = len(required) - len(args)
    if missing <= 0 or not args or not isinstance(args[0], Tensor):
        return []
    return [torch.ones_like(args[0].detach())] * missing


def run_case(
    loss: nn.Module, case: LossCase, path: str = 'loss', kind: str = ''
) -> CaseResult:
    """Run one case: forward, then backward to the predictions.

    Args:
        loss (nn.Module): The loss; not modified (a ``loss_weight`` case
            runs on a copy).
        case (LossCase): The case.
        path (str): Config path of the loss, for the result.
        kind (str): Input kind, for the result.

    Returns:
        CaseResult: The verdict with the value and the gradient.
    """
    result = CaseResult(
        path, type(loss).__name__, kind, case.name, case.group, FINITE
    )
    module = _module_for(loss, case)
    args, kwargs = case.make()
    kwargs = None if module is None else _fit_kwargs(module, kwargs)
    if kwargs is None:
        result.verdict = NOT_APPLICABLE
        result.message = 'the loss takes no such argument'
        return result
    args = _precision(args + _neutral_weights(module, args), case.precision)
    autocast = (
        torch.autocast('cpu', dtype=case.precision)
        if case.precision is not None
        else contextlib.nullcontext()
    )
    preds = [a for a in args if isinstance(a, Tensor) and a.requires_grad]
    try:
        with autocast:
            outputs = _tensors(module(*args, **kwargs))
        total = sum(o.double().sum() for o in outputs if o.requires_grad)
        grads = []
        if isinstance(total, Tensor) and total.requires_grad:
            grads = torch.autograd.grad(total, preds, allow_unused=True)
    except Exception as err:  # reported as the case's verdict
        unknown = _unknown_keyword(err, kwargs)
        if unknown is not None:
            # a forward of **kwargs hands them on to a function that takes
            # no such argument: the case cannot arise in training
            result.verdict = NOT_APPLICABLE
            result.message = f'the loss takes no argument {unknown!r}'
            return result
        result.verdict = REJECTED if case.refusal_ok else ERROR
        result.message = f'{type(err).__name__}: {err}'.splitlines()[0]
        return result
    result.value = float(sum(o.detach().double().sum() for o in outputs))
    grads = [g for g in grads if g is not None]
    result.grad = _largest(grads) if grads else None
    if not all(bool(torch.isfinite(o).all()) for o in outputs):
        result.verdict = NONFINITE_VALUE
    elif result.grad is not None and not math.isfinite(result.grad):
        result.verdict = NONFINITE_GRAD
    elif not outputs:
        result.verdict = ERROR
        result.message = 'the loss returned no tensor'
    return result


def _unknown_keyword(err: Exception, kwargs: Dict[str, Any]) -> Optional[str]:
    """The keyword of ``kwargs`` that ``err`` says a function does not
    take (``TypeError: f() got an unexpected keyword argument 'x'``), or
    None."""
    if not isinstance(err, TypeError):
        return None
    text = str(err)
    return next(
        (
            key
            for key in kwargs
            if f"unexpected keyword argument '{key}'" in text
        ),
        None,
    )


def battery_cases(
    loss: nn.Module,
    kind: Optional[str] = None,
    scope: Optional[str] = None,
    **settings,
) -> List[LossCase]:
    """The cases for ``loss`` of ``kind`` (inferred when None).

    Args:
        loss (nn.Module): The built loss.
        kind (str, optional): One of :data:`~.kinds.KINDS`.
        scope (str, optional): The config's default scope.
        **settings: See :func:`~.kinds.context_for`.

    Returns:
        list[LossCase]: The cases.

    Raises:
        ValueError: ``kind`` is unknown or cannot be inferred.
    """
    kind = kind or infer_kind(loss, scope)
    if kind not in KIND_CASES:
        raise ValueError(f'kind must be one of {KINDS}, got {kind!r}')
    ctx: BatteryContext = context_for(loss, **settings)
    return KIND_CASES[kind](ctx)


def run_battery(
    loss: nn.Module,
    kind: Optional[str] = None,
    path: str = 'loss',
    scope: Optional[str] = None,
    **settings,
) -> List[CaseResult]:
    """Run ``loss`` through every case of its kind.

    Args:
        loss (nn.Module): The built loss.
        kind (str, optional): The input kind; inferred when None.
        path (str): Config path of the loss, for the results.
        scope (str, optional): The config's default scope.
        **settings: ``num_classes``, ``angle_version``, ``ignore_index``.

    Returns:
        list[CaseResult]: One per case, in battery order.
    """
    kind = kind or infer_kind(loss, scope)
    cases = battery_cases(loss, kind, scope, **settings)
    return [run_case(loss, case, path, kind) for case in cases]
