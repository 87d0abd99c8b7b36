# Copyright (c) mmnanguard contributors. All rights reserved.
"""Put a :class:`StepGuard` in front of every optimizer step."""

import functools
from typing import Dict, List, Optional, Type

from mmengine.optim import AmpOptimWrapper, OptimWrapper, OptimWrapperDict

from ..guard.finite import grads_of, total_norm
from ..guard.step_guard import StepGuard


class GuardedOptimWrapperMixin:
    """Mixed in front of the class of an existing optimizer wrapper.

    * ``update_params`` runs backward only on a finite loss (agreed by all
      ranks). A non-finite loss poisons the accumulation window: with
      ``accumulative_counts > 1`` the window's step is dropped.
    * ``step`` checks the global gradient norm before the optimizer touches
      the weights. When ``clip_grad`` is configured, the norm the clipping
      computes is reused; otherwise one fused pass computes it. A dropped
      step zeroes the gradients.
    * Under ``AmpOptimWrapper`` the GradScaler already skips steps with
      inf/NaN gradients: the guard only counts them (a skip is exactly a
      scale decrease) and does not handle them a second time.
    """

    _nanguard: StepGuard
    _nanguard_poisoned: bool = False
    _nanguard_fast_step: bool = False
    _nanguard_clip_norm = None

    def update_params(
        self,
        loss,
        step_kwargs: Optional[Dict] = None,
        zero_kwargs: Optional[Dict] = None,
    ) -> None:
        """``OptimWrapper.update_params`` that skips backward on a
        non-finite loss."""
        if self._nanguard.loss_is_finite(loss):
            self.backward(self.scale_loss(loss))
        else:
            self._inner_count += 1  # the window advances all the same
            self._nanguard_poisoned = True
        if self.should_update():
            self.step(**(step_kwargs or {}))
            self.zero_grad(**(zero_kwargs or {}))

    def step(self, **kwargs) -> None:
        """Step only with finite gradients from an unpoisoned window."""
        guard = self._nanguard
        if self._nanguard_poisoned:
            self._nanguard_poisoned = False
            self._drop_step()
            return
        if isinstance(self, AmpOptimWrapper):
            before = self.loss_scaler.get_scale()
            super().step(**kwargs)
            guard.note_amp_step(before, self.loss_scaler.get_scale())
            return
        self._nanguard_clip_norm = None
        if self._nanguard_fast_step and self.clip_grad_kwargs:
            self._clip_grad()  # records the norm it computes
        norm = self._nanguard_clip_norm
        if norm is None:
            norm = total_norm(grads_of(self.optimizer))
        if not guard.grad_norm_is_finite(norm, self.optimizer):
            self._drop_step()
            return
        if self._nanguard_fast_step:
            self.optimizer.step(**kwargs)  # gradients are clipped already
        else:
            super().step(**kwargs)
        guard.note_step()

    def _drop_step(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self._nanguard.note_skipped_step()


_GUARDED_CLASSES: Dict[Type, Type] = {}


def _guarded_class(cls: Type) -> Type:
    if cls not in _GUARDED_CLASSES:
        _GUARDED_CLASSES[cls] = type(
            f'NanGuarded{cls.__name__}', (GuardedOptimWrapperMixin, cls), {}
        )
    return _GUARDED_CLASSES[cls]


def _record_clip_norm(wrapper, clip_func):
    def clip_and_record(params, **kwargs):
        norm = clip_func(params, **kwargs)
        wrapper._nanguard_clip_norm = norm
        return norm

    clip_and_record.__wrapped__ = clip_func
    return clip_and_record


def _keep_scheduler_step_counter(wrapper) -> None:
    """Route mmengine's step counter through the guarded ``step``.

    mmengine's param schedulers replace ``optim_wrapper.step`` with an
    *instance attribute* that counts steps and then calls the step of the
    class the wrapper had when the scheduler was built. Left alone, it would
    bypass the guard. The counter is rebuilt around the guarded ``step``.
    """
    counted = wrapper.__dict__.get('step')
    if counted is None:
        return
    del wrapper.step
    guarded = wrapper.step

    @functools.wraps(guarded)
    def step_with_counter(*args, **kwargs):
        wrapper._global_step += 1
        return guarded(*args, **kwargs)

    step_with_counter._with_counter = True  # read by mmengine's schedulers
    wrapper.step = step_with_counter


def optim_wrapper_members(optim_wrapper) -> List[OptimWrapper]:
    """The wrappers inside an ``OptimWrapperDict``, or the wrapper itself."""
    if isinstance(optim_wrapper, OptimWrapperDict):
        return list(optim_wrapper.optim_wrappers.values())
    return [optim_wrapper]


def install_step_guard(optim_wrapper, guard: StepGuard) -> None:
    """Guard every step of ``optim_wrapper`` (each member of a dict).

    The wrapper keeps its state and its class' behaviour; its class is
    replaced by a subclass with :class:`GuardedOptimWrapperMixin` in front,
    so ``isinstance`` checks keep working. Installing twice only swaps the
    guard.

    Args:
        optim_wrapper (OptimWrapper | OptimWrapperDict): The runner's.
        guard (StepGuard): The guard that decides.
    """
    for wrapper in optim_wrapper_members(optim_wrapper):
        wrapper._nanguard = guard
        if isinstance(wrapper, GuardedOptimWrapperMixin):
            continue
        cls = type(wrapper)
        wrapper.__class__ = _guarded_class(cls)
        _keep_scheduler_step_counter(wrapper)
        wrapper._nanguard_poisoned = False
        wrapper._nanguard_fast_step = cls.step is OptimWrapper.step
        if wrapper.clip_grad_kwargs:
            wrapper.clip_func = _record_clip_norm(wrapper, wrapper.clip_func)
