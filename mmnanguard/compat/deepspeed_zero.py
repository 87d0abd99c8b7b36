# Copyright (c) mmnanguard contributors. All rights reserved.
"""The one door to DeepSpeed's ZeRO-1/2 optimizer below its public API.

Checked on deepspeed 0.19.8 (``deepspeed/runtime/zero/stage_1_and_2.py``,
``DeepSpeedZeroOptimizer``) under mmengine 0.10.7's ``DeepSpeedStrategy``;
``tests/test_compat/test_deepspeed_zero.py`` fails loudly when a field used
here is gone. What the guard needs of it:

* the gradients of this rank's partition, reduced and averaged, before the
  step (``averaged_gradients``: one list of tensors, or one flat tensor,
  per param group; the same tensors ZeRO's own overflow check reads);
* a step dropped the way ZeRO drops an overflowing one (the engine's
  ``step`` runs its overflow branch: no update, the gradients and the
  partition buffers cleared, ``skipped_steps`` counted), forced by the
  guard's agreed verdict instead of ZeRO's own check;
* this rank's partition state (the fp32 master copy of the partition and
  the base optimizer's moments) as ZeRO's ``state_dict`` gives it, and its
  restore through ZeRO's ``load_state_dict`` from the fp32 copy.
"""

import contextlib
from typing import Any, Dict, Iterator, List

import torch

#: The ``DeepSpeedZeroOptimizer`` fields and methods read here.
ZERO_MEMBERS = (
    'averaged_gradients',
    'check_overflow',
    'check_grad_overflow',
    'overflow',
    'single_partition_of_fp32_groups',
    'state_dict',
    'load_state_dict',
)


def is_zero_optimizer(optimizer: Any) -> bool:
    """Whether ``optimizer`` is a ZeRO-1/2 optimizer this module knows."""
    return all(hasattr(optimizer, name) for name in ZERO_MEMBERS)


def partition_gradients(optimizer: Any) -> List[torch.Tensor]:
    """This rank's reduced gradient partition, before the step.

    Args:
        optimizer: The engine's ``DeepSpeedZeroOptimizer``.

    Returns:
        list[Tensor]: The partition's gradient tensors (none before the
        first backward or after a step).
    """
    grads: List[torch.Tensor] = []
    for group in optimizer.averaged_gradients.values():
        if isinstance(group, torch.Tensor):
            grads.append(group)
        elif group is not None:
            grads.extend(g for g in group if g is not None)
    return grads


@contextlib.contextmanager
def forced_overflow(optimizer: Any) -> Iterator[None]:
    """Within the block, ZeRO's step takes its overflow branch whatever the
    gradients hold (its own check, and the ``all_reduce`` in it, are not
    run: the ranks already agreed)."""

    def check_overflow(partition_gradients: bool = True) -> None:
        optimizer.overflow = True

    checks = optimizer.check_grad_overflow
    optimizer.check_overflow = check_overflow
    optimizer.check_grad_overflow = True
    try:
        yield
    finally:
        del optimizer.check_overflow  # the class' method again
        optimizer.check_grad_overflow = checks


def partition_state(optimizer: Any) -> Dict[str, Any]:
    """ZeRO's ``state_dict()`` of this rank: the fp32 partition
    (``single_partition_of_fp32_groups``) and the base optimizer's state
    (``base_optimizer_state``: the moments), with ZeRO's bookkeeping.

    Args:
        optimizer: The engine's ``DeepSpeedZeroOptimizer``.

    Returns:
        dict: The state (tensors aliased: copy before keeping it).
    """
    return optimizer.state_dict()


def load_partition_state(optimizer: Any, state: Dict[str, Any]) -> None:
    """Restore :func:`partition_state` of this rank (same world size): the
    moments and the fp32 master copy, which is taken from ``state`` and not
    from the module's weights.

    Args:
        optimizer: The engine's ``DeepSpeedZeroOptimizer``.
        state (dict): What :func:`partition_state` returned on this rank.
    """
    world = torch.distributed.get_world_size(optimizer.dp_process_group)
    # ZeRO indexes the list by data-parallel rank; a non-elastic state
    # (the only kind accepted, see the guarded wrapper) is read from this
    # rank's entry alone
    optimizer.load_state_dict(
        [state] * world,
        load_optimizer_states=True,
        load_from_fp32_weights=True,
    )
