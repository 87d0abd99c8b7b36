# Copyright (c) mmnanguard contributors. All rights reserved.
"""Optimizer wrappers whose every step is decided by a :class:`StepGuard`.

``NanGuardRunner`` (and so the include) builds the registered
:class:`GuardedOptimWrapper`, :class:`GuardedAmpOptimWrapper` or
:class:`GuardedCPUAmpOptimWrapper` in place of ``OptimWrapper``,
``AmpOptimWrapper`` or ``CPUAmpOptimWrapper``: same arguments, same state
dict, same ``isinstance`` answers. A user who adds ``NanGuardHook`` alone
to a plain ``Runner`` (or whose config names another wrapper class) gets
the same behaviour by :func:`install_step_guard`, which puts
:class:`GuardedOptimWrapperMixin` in front of the built wrapper's class;
that path also re-targets mmengine's param-scheduler step counter, which
was bound to the old class.

What a guarded ``step`` does:

* under AMP it unscales the gradients first (as ``AmpOptimWrapper`` does
  before ``clip_grad``);
* it asks the step guard for the verdict: one host read of every check
  (:mod:`mmnanguard.engine.guard.step_guard`). With ``clip_grad`` the read
  happens inside the clip function, before any gradient is scaled, and the
  norm goes back to mmengine as a Python float;
* on a good verdict it steps (under AMP through the GradScaler's rule:
  ``optimizer.step`` when no inf was found, then ``update``; the
  GradScaler's own ``found_inf`` read is the guard's);
* otherwise it zeroes the gradients and drops the step. Non-finite
  gradients of a finite loss under AMP are the GradScaler's skip, counted
  and not an incident; a step the guard drops leaves the scale as it was.
"""

import functools
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    List,
    Optional,
    Tuple,
    Type,
)

import torch
from mmengine.optim import AmpOptimWrapper, OptimWrapper

from mmnanguard.compat.grad_scaler_state import forget_unscale
from mmnanguard.compat.mmengine_private import count_step, static_loss_scale
from mmnanguard.function_marks import mark
from mmnanguard.registry import OPTIM_WRAPPERS, register_shared

from ..guard.optim_members import optim_wrapper_members
from ..guard.step_guard import StepGuard
from ..guard.verdict import AmpStep, StepVerdict
from .cpu_amp_optim_wrapper import CPUAmpOptimWrapper

#: ``step`` implementations the guarded step replaces entirely; any other
#: (a subclass' own) runs after the verdict, unchanged.
_KNOWN_STEPS = (OptimWrapper.step, AmpOptimWrapper.step)

if TYPE_CHECKING:
    from typing import TypeAlias

    # the mixin is put in front of an OptimWrapper (untyped: Any)
    _WrapperBase: TypeAlias = OptimWrapper
else:
    _WrapperBase = object


class GuardedOptimWrapperMixin(_WrapperBase):
    """Put in front of an ``OptimWrapper`` class: every step is decided by
    the attached :class:`StepGuard` (none attached: the class unchanged).
    """

    nanguard: Optional[StepGuard] = None
    clip_func: Callable[..., Any]  # OptimWrapper's, with clip_grad
    _nanguard_verdict: Optional[StepVerdict] = None
    _amp_step: Optional[AmpStep] = None
    _amp_iteration: int = -1

    def attach_guard(self, guard: Optional[StepGuard]) -> None:
        """Let ``guard`` decide every step (None detaches it)."""
        self.nanguard = guard
        if self.clip_grad_kwargs and not getattr(
            self.clip_func, '_nanguard', False
        ):
            self.clip_func = _clip_with_verdict(self, self.clip_func)

    def backward(self, loss: torch.Tensor, **kwargs) -> None:
        """Tell the guard the loss (no read), then run backward."""
        if self.nanguard is not None:
            self.nanguard.note_loss(self, loss)
        super().backward(loss, **kwargs)

    def step(self, **kwargs) -> None:
        """Step when the guard's verdict allows it; else drop the step."""
        guard = self.nanguard
        if guard is None:
            super().step(**kwargs)
            return
        self._nanguard_verdict = None
        known = _base_step(type(self)) in _KNOWN_STEPS
        scaler = self._enabled_scaler()
        if known and scaler is not None:
            scaler.unscale_(self.optimizer)
        if known and self.clip_grad_kwargs:
            self._clip_grad()  # the clip function reads the verdict
        verdict = self._nanguard_verdict or self._read(norm_type=2.0)
        self._nanguard_verdict = None
        stepped = verdict.allows_step()
        if not known:
            if stepped:
                super().step(**kwargs)
            else:
                self._drop_step(None)
        elif stepped:
            stepped = self._take_step(scaler, verdict, kwargs)
        else:
            self._drop_step(scaler)
        if scaler is not None and verdict.amp_raw is not None:
            verdict.amp = _amp_step(self, verdict.amp_raw, verdict.guard_drops)
            self._amp_step, self._amp_iteration = verdict.amp, guard.iteration
        amp_skip = not (stepped or verdict.guard_drops or scaler is None)
        guard.after_step(self._params(), stepped, amp_skip)

    def amp_step_of(self, iteration: int) -> Optional[AmpStep]:
        """The GradScaler's side of this wrapper's step in ``iteration``
        (read with the guard's verdict), or None when it did not step."""
        return self._amp_step if self._amp_iteration == iteration else None

    # -- helpers -------------------------------------------------------------
    def _params(self) -> List[torch.Tensor]:
        return [p for g in self.optimizer.param_groups for p in g['params']]

    def _enabled_scaler(self):
        scaler = getattr(self, 'loss_scaler', None)
        if isinstance(self, AmpOptimWrapper) and scaler is not None:
            return scaler if scaler.is_enabled() else None
        return None

    def _read(self, norm_type: float, params=None) -> StepVerdict:
        scaler = self._enabled_scaler()
        guard = self.nanguard
        if guard is None:
            raise RuntimeError('no StepGuard is attached')
        return guard.read(
            self,
            self._params() if params is None else params,
            norm_type=norm_type,
            scaler=scaler,
            optimizer=self.optimizer if scaler is not None else None,
        )

    def _take_step(self, scaler, verdict: StepVerdict, kwargs) -> bool:
        """Step (AMP: the GradScaler's rule, with the guard's read of
        ``found_inf``). Returns whether the optimizer stepped."""
        if scaler is None:
            self.optimizer.step(**kwargs)
            return True
        found_inf = verdict.amp_raw is not None and verdict.amp_raw[0]
        if getattr(self.optimizer, '_step_supports_amp_scaling', False):
            scaler.step(self.optimizer, **kwargs)  # fused optimizers
        elif not found_inf:
            self.optimizer.step(**kwargs)
        scaler.update(static_loss_scale(self))
        return not found_inf

    def _drop_step(self, scaler) -> None:
        """Zero the gradients. A GradScaler is left as it was: no
        ``update`` (the guard, not an overflow, dropped the step); its
        record of this step's ``unscale_`` is discarded, as ``update``
        would (torch keeps it in ``_per_optimizer_states``)."""
        if scaler is not None:
            forget_unscale(scaler, self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)


def _base_step(cls: Type):
    """The ``step`` the guarded class would run without the mixin."""
    for klass in cls.__mro__:
        if klass is not GuardedOptimWrapperMixin and 'step' in vars(klass):
            return vars(klass)['step']
    return None


def _amp_step(
    wrapper: Any, amp_raw: Tuple[bool, float, int], dropped_by_guard: bool
) -> AmpStep:
    """The scale after the step, from the read values (the verdict's
    ``amp_raw``) and the GradScaler's update rule (no second read): backoff
    on an inf, growth after ``growth_interval`` clean steps, a static scale
    kept; unchanged when the guard dropped the step."""
    found_inf, scale, tracker = amp_raw
    scaler = wrapper.loss_scaler
    after, tracker_after = scale, tracker
    if dropped_by_guard:
        pass
    elif (static := static_loss_scale(wrapper)) is not None:
        after = float(static)
    elif found_inf:
        after, tracker_after = scale * scaler.get_backoff_factor(), 0
    elif tracker + 1 >= scaler.get_growth_interval():
        after, tracker_after = scale * scaler.get_growth_factor(), 0
    else:
        tracker_after = tracker + 1
    return AmpStep(
        scale_before=scale,
        scale_after=after,
        tracker_before=tracker,
        tracker_after=tracker_after,
        found_inf=bool(found_inf) and not dropped_by_guard,
    )


def _clip_with_verdict(
    wrapper: GuardedOptimWrapperMixin, clip_func: Callable[..., Any]
) -> Callable[..., Any]:
    """``clip_func`` that reads the step's verdict first (before any
    gradient is scaled) and, for norm clipping, clips with the norm it read
    and returns it as a Python float."""
    norm_clip = clip_func is torch.nn.utils.clip_grad_norm_

    @functools.wraps(clip_func)
    def clip(params, **kwargs):
        if wrapper.nanguard is None or wrapper._nanguard_verdict is not None:
            return clip_func(params, **kwargs)
        params = list(params)
        norm_type = float(kwargs.get('norm_type', 2.0)) if norm_clip else 2.0
        verdict = wrapper._read(norm_type, params)
        wrapper._nanguard_verdict = verdict
        if not norm_clip:
            return clip_func(params, **kwargs)
        # a read verdict always carries the norm on the device
        if verdict.allows_step() and verdict.grad_total is not None:
            torch.nn.utils.clip_grads_with_norm_(
                params,
                kwargs['max_norm'],
                verdict.grad_total,
                foreach=kwargs.get('foreach'),
            )
        return verdict.grad_norm

    return mark(clip, '_nanguard')


@register_shared(OPTIM_WRAPPERS)
class GuardedOptimWrapper(GuardedOptimWrapperMixin, OptimWrapper):
    """``OptimWrapper`` whose steps a ``NanGuardHook`` decides.

    Example:
        >>> optim_wrapper = dict(type='GuardedOptimWrapper',
        ...                      optimizer=dict(type='SGD', lr=0.01))
    """


@register_shared(OPTIM_WRAPPERS)
class GuardedAmpOptimWrapper(GuardedOptimWrapperMixin, AmpOptimWrapper):
    """``AmpOptimWrapper`` whose steps a ``NanGuardHook`` decides."""


@register_shared(OPTIM_WRAPPERS)
class GuardedCPUAmpOptimWrapper(GuardedOptimWrapperMixin, CPUAmpOptimWrapper):
    """``CPUAmpOptimWrapper`` whose steps a ``NanGuardHook`` decides."""


#: The registered guarded class of each upstream wrapper type name.
GUARDED_TYPES = {
    'OptimWrapper': 'GuardedOptimWrapper',
    'AmpOptimWrapper': 'GuardedAmpOptimWrapper',
    'CPUAmpOptimWrapper': 'GuardedCPUAmpOptimWrapper',
    'DeepSpeedOptimWrapper': 'GuardedDeepSpeedOptimWrapper',
}

_SWAPPED: Dict[Type, Type] = {}


def register_swap(upstream: Type, guarded: Type) -> None:
    """Make :func:`install_step_guard` swap an ``upstream`` wrapper's class
    for ``guarded`` (a registered guarded subclass of it with a step of its
    own) instead of putting the mixin in front of it.

    Args:
        upstream (type): The upstream wrapper class.
        guarded (type): Its guarded subclass.
    """
    if not issubclass(guarded, upstream):
        raise TypeError(
            f'register_swap: {guarded.__name__} is not a subclass of '
            f'{upstream.__name__}'
        )
    _SWAPPED[upstream] = guarded


def _guarded_class(cls: Type) -> Type:
    if cls not in _SWAPPED:
        _SWAPPED[cls] = type(
            f'NanGuarded{cls.__name__}', (GuardedOptimWrapperMixin, cls), {}
        )
    return _SWAPPED[cls]


def _retarget_scheduler_counter(wrapper) -> None:
    """mmengine's param schedulers replace ``optim_wrapper.step`` with an
    instance attribute that counts steps and calls the ``step`` of the
    class the wrapper had when they were built; after a class swap it is
    rebuilt around the guarded ``step`` (``_global_step`` and the
    ``_with_counter`` mark are what mmengine's schedulers read)."""
    if 'step' not in wrapper.__dict__:
        return
    del wrapper.step
    guarded = wrapper.step

    @functools.wraps(guarded)
    def step_with_counter(*args, **kwargs):
        count_step(wrapper)
        return guarded(*args, **kwargs)

    wrapper.step = mark(step_with_counter, '_with_counter')


def install_step_guard(optim_wrapper, guard: StepGuard) -> List[str]:
    """Let ``guard`` decide every step of ``optim_wrapper`` (each member of
    an ``OptimWrapperDict``).

    A registered guarded wrapper (what ``NanGuardRunner`` builds) is only
    attached. Any other wrapper's class is replaced by a subclass with
    :class:`GuardedOptimWrapperMixin` in front (``isinstance`` keeps
    working); that is the path of a ``NanGuardHook`` added alone.

    Args:
        optim_wrapper (OptimWrapper | OptimWrapperDict): The runner's.
        guard (StepGuard): The guard that decides.

    Returns:
        list[str]: The class names that were swapped (for the log).
    """
    swapped = []
    for wrapper in optim_wrapper_members(optim_wrapper):
        if not isinstance(wrapper, GuardedOptimWrapperMixin):
            swapped.append(type(wrapper).__name__)
            wrapper.__class__ = _guarded_class(type(wrapper))
            _retarget_scheduler_counter(wrapper)
        wrapper.attach_guard(guard)
    return swapped
