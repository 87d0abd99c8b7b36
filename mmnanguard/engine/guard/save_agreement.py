# Copyright (c) mmnanguard contributors. All rights reserved.
"""Every rank checks the state before a checkpoint is written.

mmengine writes checkpoints on rank 0 only (``Runner.save_checkpoint`` and
``DDPStrategy.save_checkpoint`` are ``@master_only``), so the
``before_save_checkpoint`` hooks run on rank 0 alone. A collective there
waits for peers that are already in their next backward (gloo aborts with
"Received data size doesn't match expected size"; NCCL hangs), and a
non-finite state handled there alone (a rollback, a raise) leaves the other
ranks training another state.

So the agreement runs where every rank still is: in ``save_checkpoint``
itself, before its master-only part. A queued parameter check is read
(agreed), then each rank checks its own model and optimizer state (its
shards, under sharded training), and one ``all_reduce`` agrees on the
finding. When any rank found a non-finite value, every rank handles the
incident the same way, before rank 0 writes the (restored) state. Rank 0's
``before_save_checkpoint`` then checks the very state that is written, as
in a single process, with no collective.

The protected runners call the agreement from their own
``save_checkpoint``. Under any other runner (``NanGuardHook`` added alone to
a plain ``Runner``, ``FlexibleRunner`` or a toolbox's subclass), the hook
puts :func:`agree_around_saves` around the runner's ``save_checkpoint``,
which mmengine's ``CheckpointHook`` calls on every rank.
"""

import functools
from typing import Any, Callable, Dict

from mmengine.model import is_model_wrapper

from .finite import nonfinite_paths
from .rank_agreement import any_rank, is_distributed, local_tensors
from .snapshot import optimizer_state


def agree_before_save(runner: Any, responder: Any, traces: Dict) -> bool:
    """Check the state about to be saved on every rank, agree, and handle a
    non-finite one on every rank (call it on every rank, before the
    master-only write).

    Args:
        runner: The runner.
        responder (GuardResponder): The guard's responder.
        traces (dict): The hook's iteration traces (batch and RNG state by
            iteration), for the incident folder.

    Returns:
        bool: Whether an incident was handled (the state was restored, or
        the policy raised before this returns).
    """
    if not is_distributed() or responder.step_guard is None:
        return False  # one process, or training has not started
    if responder.check_pending_params(runner, traces):
        return True  # the agreed parameter check restored a good state
    model = runner.model
    inner = model.module if is_model_wrapper(model) else model
    state = dict(
        state_dict=local_tensors(inner.state_dict()),
        # a ZeRO wrapper's own partitions (fp32 master copy, moments) too
        optimizer=local_tensors(optimizer_state(runner.optim_wrapper)),
    )
    bad = nonfinite_paths(state)
    if not any_rank(bool(bad)):
        return False
    responder.checkpoint_incident(runner, traces, bad)
    return True


def agree_around_saves(runner: Any, agree: Callable[[Any], Any]) -> None:
    """Make ``runner.save_checkpoint`` call ``agree(runner)`` first, on the
    runner instance (its class is left as it is).

    mmengine's ``CheckpointHook`` (interval, ``save_last``, ``save_best``)
    calls ``runner.save_checkpoint`` on every rank, and only its body runs
    on rank 0; the agreement runs on every rank before that body. A caller
    that reaches ``save_checkpoint`` on rank 0 alone (``if rank == 0:
    runner.save_checkpoint(...)``) would leave the other ranks out of the
    agreement: call it on every rank, as mmengine's own hooks do.

    Args:
        runner: The runner (``Runner``, ``FlexibleRunner`` or a subclass).
        agree (callable): Called with the runner on every rank before the
            checkpoint is built.
    """
    save = runner.save_checkpoint
    if getattr(save, 'nanguard_agrees', False):
        return

    @functools.wraps(save)
    def save_checkpoint(*args: Any, **kwargs: Any) -> Any:
        agree(runner)
        return save(*args, **kwargs)

    save_checkpoint.nanguard_agrees = True  # type: ignore[attr-defined]
    runner.save_checkpoint = save_checkpoint
