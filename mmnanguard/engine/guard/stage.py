# Copyright (c) mmnanguard contributors. All rights reserved.
"""Where the first non-finite value was seen in the live iteration.

The guard's own evidence decides, in the order the iteration runs:

* ``data``: the inputs or targets after the data preprocessor held a
  non-finite value (``StepVerdict.inputs_finite``);
* ``forward``: the inputs were finite, a buffer the forward writes
  (BatchNorm statistics) was not (``StepVerdict.buffers_finite``);
* ``loss``: the inputs were finite, a loss term was not;
* ``backward``: the loss was finite, the gradient norm was not;
* ``optimizer``: the gradients were finite, the parameters after the step
  were not;
* ``checkpoint``: a checkpoint about to be written held non-finite state.

A non-finite activation before any loss is not visible to the guard,
which probes no module while training is healthy: the diagnosis sets
``forward`` when its replay reproduces the incident and finds one.
Spike incidents (finite values) take the stage of the check that vetoed.
"""

from typing import Any, Dict, Optional

from ..incident import IncidentKind, Stage, json_number
from .verdict import StepVerdict

#: The stages, in the order the iteration runs.
STAGES = tuple(s.value for s in Stage)


def live_stage(
    kind: IncidentKind, verdict: Optional[StepVerdict]
) -> Dict[str, Any]:
    """The stage of an incident and the live evidence behind it.

    Args:
        kind (IncidentKind): The incident kind.
        verdict (StepVerdict, optional): The step's verdict (None for a
            checkpoint, or a parameter check read after training).

    Returns:
        dict: ``stage`` (one of :data:`STAGES`) and ``live``: ``stage``
        again (the diagnosis may refine the report's), ``inputs_finite``
        (None when the model's batch was not seen), ``loss_finite``,
        ``grad_norm``, ``params_finite`` (None when not checked) and
        ``text`` (one line).
    """
    kind = IncidentKind(kind)
    v = verdict or StepVerdict(iteration=-1)
    # a parameter check is read with the next step, whose inputs are not
    # those of the bad step
    inputs = None if kind.weights_damaged else v.inputs_finite
    params_finite = False if kind is IncidentKind.NONFINITE_PARAMS else None
    if kind is IncidentKind.NONFINITE_CHECKPOINT:
        stage, text = Stage.CHECKPOINT, 'the checkpoint state held non-finite'
    elif kind is IncidentKind.NONFINITE_PARAMS:
        stage = Stage.OPTIMIZER
        text = 'loss and gradients finite, parameters non-finite after step'
    elif v.exception is not None:
        stage = Stage.coerce(v.exception_stage, 'stage') or Stage.LOSS
        text = f'{v.exception} raised in the {stage} (a numerical routine)'
    elif inputs is False:
        stage = Stage.DATA
        text = 'the inputs after the data preprocessor held non-finite values'
    elif v.buffers_bad:
        stage = Stage.FORWARD
        named = ', '.join(f'`{n}`' for n in v.restored_buffers[:3])
        more = len(v.restored_buffers) - 3
        named += f' (and {more} more)' if more > 0 else ''
        text = (
            'inputs finite, the forward wrote non-finite buffers'
            f'{": " + named if named else ""} (restored to their values '
            'before it)'
        )
    elif not v.loss_finite:
        stage, text = Stage.LOSS, 'inputs finite, a loss term non-finite'
    elif kind is IncidentKind.NONFINITE_GRAD:
        stage = Stage.BACKWARD
        text = f'loss finite, gradient norm {v.grad_norm}'
    else:
        grad_only = v.spikes and all(s.stage == 'grad' for s in v.spikes)
        stage = Stage.BACKWARD if grad_only else Stage.LOSS
        vetoed = '; '.join(s.describe() for s in v.spikes) or v.veto
        text = f'finite values vetoed: {vetoed}'
    if inputs is None and stage != 'checkpoint':
        text += ' (inputs not seen)'
    return dict(
        stage=stage,
        live=dict(
            stage=stage,
            inputs_finite=inputs,
            loss_finite=v.loss_finite if not kind.weights_damaged else True,
            grad_norm=None
            if v.grad_norm is None or kind.weights_damaged
            else json_number(v.grad_norm),
            params_finite=params_finite,
            text=text,
        ),
    )
