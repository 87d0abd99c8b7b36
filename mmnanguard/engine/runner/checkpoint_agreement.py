# Copyright (c) mmnanguard contributors. All rights reserved.
"""Every rank checks the state before a checkpoint is written.

mmengine writes checkpoints on rank 0 only (``Runner.save_checkpoint`` and
``DDPStrategy.save_checkpoint`` are ``@master_only``), so the
``before_save_checkpoint`` hooks run on rank 0 alone. A non-finite state
found there and handled there (a rollback, a raise) would leave the other
ranks training a different state, or waiting in a collective forever.

The protected runners call :func:`agree_before_save` on every rank first:
a queued parameter check is read (agreed), then each rank checks its own
model and optimizer state (its shards, under sharded training), and one
``all_reduce`` agrees on the finding. When any rank found a non-finite
value, every rank handles the incident the same way, before rank 0 writes
the (restored) state. Rank 0's ``before_save_checkpoint`` then checks the
very state that is written, as in a single process.
"""

from typing import Any, Optional

from mmengine.model import is_model_wrapper

from ..guard.finite import nonfinite_paths
from ..guard.rank_agreement import any_rank, is_distributed, local_tensors
from ..hooks import NanGuardHook


def guard_hook(runner: Any) -> Optional[NanGuardHook]:
    """The runner's ``NanGuardHook``, or None."""
    for hook in runner.hooks:
        if isinstance(hook, NanGuardHook):
            return hook
    return None


def agree_before_save(runner: Any) -> bool:
    """Check the state about to be saved on every rank, agree, and handle a
    non-finite one on every rank (call it on every rank, before the
    master-only write).

    Args:
        runner: The protected runner.

    Returns:
        bool: Whether an incident was handled (the state was restored, or
        the policy raised before this returns).
    """
    hook = guard_hook(runner)
    if hook is None or not is_distributed():
        return False
    responder = hook.responder
    if responder.step_guard is None:  # training has not started
        return False
    traces = hook._traces
    if responder.check_pending_params(runner, traces):
        return True  # the agreed parameter check restored a good state
    model = runner.model
    inner = model.module if is_model_wrapper(model) else model
    state = dict(
        state_dict=local_tensors(inner.state_dict()),
        optimizer=local_tensors(runner.optim_wrapper.state_dict()),
    )
    bad = nonfinite_paths(state)
    if not any_rank(bool(bad)):
        return False
    responder.checkpoint_incident(runner, traces, bad)
    return True
