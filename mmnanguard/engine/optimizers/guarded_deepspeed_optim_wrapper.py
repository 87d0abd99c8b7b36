# Copyright (c) mmnanguard contributors. All rights reserved.
"""``DeepSpeedOptimWrapper`` whose every step the guard decides (ZeRO-1/2).

mmengine's ``DeepSpeedStrategy`` builds a ``DeepSpeedOptimWrapper``: its
``backward`` and ``step`` are the DeepSpeed engine's, and its
``optimizer`` is the engine's ZeRO optimizer, whose ``param_groups`` hold
this rank's fp32 partition. The engine's ``backward`` reduces the
gradients into each rank's partition and clears ``param.grad``, so the
guard reads the partition's gradients
(:mod:`mmnanguard.compat.deepspeed_zero`), the ones ZeRO's own overflow
check reads, in its one read; the read's
``all_reduce`` sums each rank's flags, so a NaN in one rank's partition
stops the step on every rank. The gradient norm in the verdict (and the
incident report) is this rank's partition's, not the global one.

What a guarded ``step`` does:

* a good verdict: the engine's ``step``. Where ZeRO still skips it (its
  own overflow check), the step is reported with a non-finite gradient:
  the guard records the incident (all ranks agree: ZeRO reduces its flag
  over the ranks);
* a bad verdict: the engine's ``step`` takes ZeRO's overflow branch
  (forced; no update, the gradients and partition buffers cleared, the
  fp32 partition and the moments unchanged, the engine's
  ``skipped_steps`` counted).

A rollback restores ZeRO's partition state of this rank (the fp32 master
copy and the moments) with the module's weights
(:meth:`snapshot_state_dict`). ``state_dict`` stays mmengine's (what the
strategy saves as client state, from rank 0).
"""

from typing import Any, Dict, List, Optional

import torch
from mmengine._strategy.deepspeed import DeepSpeedOptimWrapper

from mmnanguard.compat import deepspeed_zero
from mmnanguard.registry import OPTIM_WRAPPERS, register_shared

from ..guard.step_guard import StepGuard
from ..guard.verdict import StepVerdict
from .guarded_optim_wrapper import GuardedOptimWrapperMixin, register_swap


class PartitionGrad:
    """What the step guard reads of a gradient: ``.grad`` (a ZeRO
    partition's tensor, which belongs to no single parameter).

    Args:
        grad (Tensor): The gradient tensor.
    """

    __slots__ = ('grad',)

    def __init__(self, grad: torch.Tensor) -> None:
        self.grad = grad


@register_shared(OPTIM_WRAPPERS)
class GuardedDeepSpeedOptimWrapper(
    GuardedOptimWrapperMixin, DeepSpeedOptimWrapper
):
    """``DeepSpeedOptimWrapper`` (ZeRO-1/2) whose steps a ``NanGuardHook``
    decides.

    Example:
        >>> optim_wrapper = dict(type='GuardedDeepSpeedOptimWrapper',
        ...                      optimizer=dict(type='SGD', lr=0.01))
    """

    def attach_guard(self, guard: Optional[StepGuard]) -> None:
        """Let ``guard`` decide every step (None detaches it).

        Raises:
            TypeError: The engine's optimizer is not ZeRO-1/2's.
        """
        if guard is not None and not deepspeed_zero.is_zero_optimizer(
            self.optimizer
        ):
            raise TypeError(
                'nanguard: GuardedDeepSpeedOptimWrapper guards ZeRO stage '
                '1 and 2 only; the engine built '
                f'{type(self.optimizer).__name__}. Set '
                'strategy.zero_optimization=dict(stage=1) or 2 in the config'
            )
        self.nanguard = guard

    def backward(self, loss: torch.Tensor, **kwargs) -> None:
        """Tell the guard the loss (no read), then the engine's backward."""
        if self.nanguard is not None:
            self.nanguard.note_loss(self, loss)
        super().backward(loss, **kwargs)

    def step(self, **kwargs) -> None:
        """The engine's step when the guard's verdict allows it; else the
        step dropped the way ZeRO drops an overflowing one."""
        guard = self.nanguard
        if guard is None:
            super().step(**kwargs)
            return
        grads = deepspeed_zero.partition_gradients(self.optimizer)
        verdict = guard.read(self, [PartitionGrad(g) for g in grads])
        stepped = verdict.allows_step()
        if stepped:
            super().step(**kwargs)
            stepped = self._engine.was_step_applied()
            if not stepped:
                _record_zero_skip(verdict)
        else:
            with deepspeed_zero.forced_overflow(self.optimizer):
                super().step(**kwargs)
        guard.after_step(self._params(), stepped)

    def snapshot_state_dict(self) -> Dict[str, Any]:
        """``state_dict()`` with this rank's ZeRO partition state under
        ``zero`` (the fp32 master copy and the moments): what a rollback
        restores."""
        state = self.state_dict()
        state['zero'] = deepspeed_zero.partition_state(self.optimizer)
        return state

    def load_snapshot_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore :meth:`snapshot_state_dict` (of this rank)."""
        state = dict(state)
        zero = state.pop('zero', None)
        self.load_state_dict(state)
        if zero is not None:
            deepspeed_zero.load_partition_state(self.optimizer, zero)

    # -- helpers -------------------------------------------------------------
    @property
    def _engine(self) -> Any:
        """The DeepSpeed engine (inside mmengine's engine wrapper)."""
        return self.model.model

    def _params(self) -> List[torch.Tensor]:
        """This rank's fp32 partition (the ZeRO optimizer's params)."""
        return [p for g in self.optimizer.param_groups for p in g['params']]


def _record_zero_skip(verdict: StepVerdict) -> None:
    """ZeRO skipped a step the guard allowed (its own overflow check,
    reduced over the ranks, so every rank comes here): report it as a
    non-finite gradient (``local_grad_finite`` stays the guard's reading:
    ZeRO does not say which rank's partition held it)."""
    verdict.grad_finite = False


register_swap(DeepSpeedOptimWrapper, GuardedDeepSpeedOptimWrapper)
