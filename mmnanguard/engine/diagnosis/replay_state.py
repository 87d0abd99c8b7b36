# Copyright (c) mmnanguard contributors. All rights reserved.
"""Which model state an in-training replay starts from, and in which
precision.

The incident listeners run while the incident folder is written (before
its ``report.json``) and before the guard's policy acts. At that moment:

* ``nonfinite_loss`` / ``nonfinite_grad``: the guard skipped backward or
  dropped the step, so the live weights are exactly the state just before
  the bad update. The replay starts from them.
* ``nonfinite_params``: the step was taken and the weights (or the
  optimizer state) are already bad. The replay starts from the newest
  ``TrainingSnapshot`` of the guard taken at or before this iteration:
  exact when it was taken at this iteration (``snapshot_interval=1``),
  approximate otherwise (the report says how many iterations earlier).
  Without a snapshot, the live (bad) weights are replayed and the report
  says so.

The replay runs on the trained model itself, between two iterations: its
state dict (weights and BatchNorm statistics, copied to the CPU), its
gradients and its train/eval modes are saved first and restored after the
replay, so training continues exactly as if no replay had happened. (A deep
copy of the model cannot be made reliably: mmengine models may hold
non-leaf tensors, e.g. the last loss terms, which ``copy.deepcopy``
refuses.) The probe's hooks exist only during the replay. Hooks that an
engine put on the parameters' gradient accumulation (DeepSpeed ZeRO) are
muted during the replay and put back after it.

Under torch's FSDP1 (mmengine's ``FSDPStrategy``) the module's own
parameters are this rank's shard of a flat parameter; outside FSDP's
forward they are not the layers' weights (``mat2 must be a matrix``), and
a replay through FSDP's forward would add all-gathers that only this rank
makes. :func:`replay_unavailable` says so, and the incident is recorded
with that reason instead of a diagnosis.
"""

from contextlib import contextmanager
from typing import Any, Iterator, List, Optional, Tuple

import torch
from mmengine.optim import AmpOptimWrapper
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel

from ..guard.optim_members import optim_wrapper_members
from ..guard.snapshot import unwrap_model
from ..incident import ReportData


def _describe_state(
    model: nn.Module, report: ReportData, snapshots: Any
) -> str:
    """Load the state to replay from into ``model``; say which it is."""
    iteration = report['iteration']
    if report['kind'] != 'nonfinite_params':
        return (
            f'the live weights at iteration {iteration}: the guard '
            'dropped this update, so they are exactly the state just '
            'before it'
        )
    usable = [s for s in snapshots if s.iteration <= iteration]
    if not usable:
        return (
            'the live weights AFTER the bad update (the guard holds no '
            'snapshot; policy=rollback, or escalate_to=rollback with '
            'snapshot_interval=1, makes the replay exact)'
        )
    snapshot = usable[-1]
    model.load_state_dict(snapshot.model)
    if snapshot.iteration == iteration:
        return (
            f'the guard snapshot of iteration {iteration}: exactly the '
            'state just before the bad update'
        )
    return (
        f'the guard snapshot of iteration {snapshot.iteration}, '
        f'{iteration - snapshot.iteration} iteration(s) before the bad '
        'update (approximate; snapshot_interval=1 makes it exact)'
    )


def replay_unavailable(model: nn.Module) -> Optional[str]:
    """Why the batch cannot be replayed on ``model`` (the runner's model,
    wrapped), or None.

    Args:
        model (nn.Module): The runner's model.

    Returns:
        str | None: The reason, for the report's ``diagnosis_skipped``.
    """
    if any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
        return (
            "no replay under FSDP1 (mmengine's FSDPStrategy): each rank "
            "holds a shard of flat parameters, not the layers' weights; "
            "the guard's verdict, loss terms and gradient norm stand. To "
            'diagnose it, replay the incident in one process: python '
            'tools/replay.py INCIDENT_DIR --config CONFIG --checkpoint '
            'CHECKPOINT (a full-state checkpoint from before the incident)'
        )
    return None


@contextmanager
def replay_model(
    runner, report: ReportData, snapshots: Any = ()
) -> Iterator[Tuple[nn.Module, str]]:
    """The runner's model in the state to replay from; everything restored
    on exit.

    Args:
        runner (Runner): The runner.
        report (dict): The incident report (``kind``, ``iteration``).
        snapshots: The guard's ``TrainingSnapshot`` deque.

    Yields:
        tuple: ``(model, description of the replayed state)``.
    """
    model = unwrap_model(runner.model)
    saved = {
        k: v.detach().to('cpu', copy=True)
        for k, v in model.state_dict().items()
    }
    grads = [(p, p.grad) for p in model.parameters()]
    modes = [(m, m.training) for m in model.modules()]
    muted = _mute_gradient_hooks(model)
    try:
        for param, _ in grads:
            param.grad = None
        yield model, _describe_state(model, report, snapshots)
    finally:
        model.load_state_dict(saved)
        for param, grad in grads:
            param.grad = grad
        for module, training in modes:
            module.training = training
        for hooks, entries in muted:
            hooks.update(entries)


def _mute_gradient_hooks(model: nn.Module) -> List[Tuple[dict, dict]]:
    """Empty the hooks that run when a parameter's gradient is accumulated
    (``register_post_accumulate_grad_hook``; DeepSpeed ZeRO reduces and
    partitions the gradient there) for the replay, and return them to put
    back. A replay's backward through them ran the engine's bookkeeping a
    second time for one step ("has already been reduced" at the next
    step). The hooks' own dict is emptied, not replaced: torch calls the
    hooks in that very dict, and their handles stay valid."""
    muted = []
    for param in model.parameters():
        hooks = getattr(param, '_post_accumulate_grad_hooks', None)
        if hooks:
            muted.append((hooks, dict(hooks)))
            hooks.clear()
    return muted


def amp_settings(
    optim_wrapper,
) -> Tuple[Optional[torch.dtype], Optional[float]]:
    """``(autocast dtype, loss scale)`` of the first AMP member of
    ``optim_wrapper``; ``(None, None)`` without AMP."""
    for wrapper in optim_wrapper_members(optim_wrapper):
        if isinstance(wrapper, AmpOptimWrapper):
            dtype = wrapper.cast_dtype or torch.float16
            return dtype, float(wrapper.loss_scaler.get_scale())
    return None, None
