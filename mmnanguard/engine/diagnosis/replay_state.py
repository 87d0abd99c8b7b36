# Copyright (c) mmnanguard contributors. All rights reserved.
"""Which model state an in-training replay starts from, and in which
precision.

The incident listeners run after the incident is written and before the
guard's policy acts. At that moment:

* ``nonfinite_loss`` / ``nonfinite_grad``: the guard skipped backward or
  dropped the step, so the live weights are exactly the state just before
  the bad update. The replay starts from a copy of them.
* ``nonfinite_params``: the step was taken and the weights (or the
  optimizer state) are already bad. The replay starts from the newest
  ``TrainingSnapshot`` of the guard taken at or before this iteration:
  exact when it was taken at this iteration (``snapshot_interval=1``),
  approximate otherwise (the report says how many iterations earlier).
  Without a snapshot, the live (bad) weights are replayed and the report
  says so.

The replay always runs on a deep copy of the model: the trained model never
carries a diagnostic hook, and its BatchNorm statistics and gradients are
untouched.
"""
import copy
from typing import Any, Dict, Optional, Tuple

import torch
from mmengine.optim import AmpOptimWrapper
from torch import nn

from ..guard.snapshot import unwrap_model
from ..optimizers import optim_wrapper_members


def replay_model(runner, report: Dict[str, Any],
                 snapshots: Any = ()) -> Tuple[nn.Module, str]:
    """A copy of the runner's model in the state to replay from.

    Args:
        runner (Runner): The runner.
        report (dict): The incident report (``kind``, ``iteration``).
        snapshots: The guard's ``TrainingSnapshot`` deque.

    Returns:
        tuple: ``(model, description of the state)``.
    """
    model = copy.deepcopy(unwrap_model(runner.model))
    iteration = report['iteration']
    if report['kind'] != 'nonfinite_params':
        return model, (f'the live weights at iteration {iteration}: the guard'
                       ' dropped this update, so they are exactly the state '
                       'just before it')
    usable = [s for s in snapshots if s.iteration <= iteration]
    if not usable:
        return model, ('the live weights AFTER the bad update (the guard '
                       'holds no snapshot; use policy=rollback or '
                       'escalate_to=rollback with snapshot_interval=1 for an '
                       'exact replay)')
    snapshot = usable[-1]
    model.load_state_dict(snapshot.model)
    if snapshot.iteration == iteration:
        return model, (f'the guard snapshot of iteration {iteration}: exactly'
                       ' the state just before the bad update')
    return model, (f'the guard snapshot of iteration {snapshot.iteration}, '
                   f'{iteration - snapshot.iteration} iteration(s) before '
                   'the bad update (approximate: snapshot_interval=1 makes '
                   'it exact)')


def amp_settings(optim_wrapper) -> Tuple[Optional[torch.dtype],
                                         Optional[float]]:
    """``(autocast dtype, loss scale)`` of the first AMP member of
    ``optim_wrapper``; ``(None, None)`` without AMP."""
    for wrapper in optim_wrapper_members(optim_wrapper):
        if isinstance(wrapper, AmpOptimWrapper):
            dtype = wrapper.cast_dtype or torch.float16
            return dtype, float(wrapper.loss_scaler.get_scale())
    return None, None
