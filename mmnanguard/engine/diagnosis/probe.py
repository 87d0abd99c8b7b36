# Copyright (c) mmnanguard contributors. All rights reserved.
"""Hooks on every module of a model, installed for one replay only.

* A forward hook on every module records, in execution order, the first
  module whose output holds a non-finite value (and whether its inputs
  were finite, i.e. whether the module made it or passed it on).
* ``Tensor.register_hook`` on every floating module output that requires
  grad records, in backward order, the first module whose output gradient
  is non-finite. ``register_full_backward_hook`` is not used: on mmdet
  models with in-place ReLU it raises ``Output 0 of BackwardHookFunction is
  a view and is being modified inplace`` (docs STACK.md, breakage 5).
* ``register_post_accumulate_grad_hook`` on every parameter records, in
  backward order, the parameters whose gradient is non-finite.
* The same forward hook records, per module call, the largest absolute
  value of the output and of the inputs, and of the module's own weights
  (see :mod:`.magnitude`).

Use it as a context manager; every handle is removed on exit.
"""

from typing import Any, Dict, List, Optional

import torch
from torch import nn

from .magnitude import max_abs, own_weight_max
from .tree import first_nonfinite, iter_tensors, nonfinite_summary


def is_loss_module(name: str, module: nn.Module) -> bool:
    """Whether a module computes a loss (mmdet naming: ``loss_cls``,
    ``loss_bbox``, ``loss_decode``; or a class named ``*Loss``)."""
    leaf = name.rsplit('.', 1)[-1]
    return leaf.startswith('loss') or type(module).__name__.endswith('Loss')


class ActivationProbe:
    """Record the first non-finite activation and output gradient.

    Args:
        model (nn.Module): The model to probe, for the length of one
            replay (the hooks never stay on a model that trains).
        max_params (int): Non-finite parameter gradients listed at most.

    Attributes:
        forward_first (dict | None): First non-loss module (execution
            order) with a non-finite output: ``module``, ``type``,
            ``inputs_finite``, ``call_index`` and the tensor summary.
        loss_first (dict | None): Same, for the first loss module.
        grad_first (dict | None): First module (backward order) whose
            output gradient is non-finite.
        param_grads (list[dict]): Parameters with non-finite gradients, in
            the order their gradients were accumulated.
        magnitudes (list[dict]): Per non-loss module call, in execution
            order: ``module``, ``type``, ``out_max``, ``in_max`` and
            ``weight_max`` (largest absolute output, input and own weight;
            None where there is none).
    """

    def __init__(self, model: nn.Module, max_params: int = 10) -> None:
        self.model = model
        self.max_params = max_params
        self.forward_first: Optional[Dict[str, Any]] = None
        self.loss_first: Optional[Dict[str, Any]] = None
        self.grad_first: Optional[Dict[str, Any]] = None
        self.param_grads: List[Dict[str, Any]] = []
        self.magnitudes: List[Dict[str, Any]] = []
        self._weight_max: Dict[str, Optional[float]] = {}
        self.calls = 0
        self.grad_calls = 0
        self.record_grads = True
        self._handles: List[Any] = []

    def __enter__(self) -> 'ActivationProbe':
        for name, module in self.model.named_modules():
            if not name:
                continue  # the root returns the losses dict: see replay
            self._handles.append(
                module.register_forward_hook(self._forward_hook(name))
            )
        for name, param in self.model.named_parameters():
            if param.requires_grad:
                self._handles.append(
                    param.register_post_accumulate_grad_hook(
                        self._param_hook(name)
                    )
                )
        return self

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    # -- forward ----------------------------------------------------------
    def _forward_hook(self, name: str):
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            self.calls += 1
            loss = is_loss_module(name, module)
            if (self.loss_first if loss else self.forward_first) is None:
                bad = first_nonfinite(output)
                if bad is not None:
                    bad.update(
                        module=name,
                        type=type(module).__name__,
                        call_index=self.calls,
                        inputs_finite=first_nonfinite(args) is None,
                    )
                    if loss:
                        self.loss_first = bad
                    else:
                        self.forward_first = bad
            if not loss:
                self._record_magnitude(name, module, args, output)
            if torch.is_grad_enabled() and not loss:
                for path, tensor in iter_tensors(output):
                    if tensor.requires_grad and tensor.is_floating_point():
                        tensor.register_hook(self._grad_hook(name, path))

        return hook

    def _record_magnitude(
        self, name: str, module: nn.Module, args: Any, output: Any
    ) -> None:
        if name not in self._weight_max:
            self._weight_max[name] = own_weight_max(module)
        self.magnitudes.append(
            dict(
                module=name,
                type=type(module).__name__,
                out_max=max_abs(output),
                in_max=max_abs(args),
                weight_max=self._weight_max[name],
            )
        )

    # -- backward ---------------------------------------------------------
    def _grad_hook(self, name: str, path: str):
        def hook(grad: torch.Tensor) -> None:
            if not self.record_grads:
                return
            self.grad_calls += 1
            if self.grad_first is None:
                bad = nonfinite_summary(grad)
                if bad is not None:
                    self.grad_first = dict(
                        module=name,
                        output_path=path or '(output)',
                        call_index=self.grad_calls,
                        **bad,
                    )

        return hook

    def _param_hook(self, name: str):
        def hook(param: torch.Tensor) -> None:
            if (
                not self.record_grads
                or len(self.param_grads) >= self.max_params
            ):
                return
            bad = nonfinite_summary(param.grad)
            if bad is not None:
                self.param_grads.append(dict(name=name, **bad))

        return hook
