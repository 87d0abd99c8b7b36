# Copyright (c) mmnanguard contributors. All rights reserved.
"""Where the first non-finite value was seen in the live iteration.

The guard's own evidence decides, in the order the iteration runs:

* ``data``: the inputs or targets after the data preprocessor held a
  non-finite value (``IterationRecord.inputs_finite``);
* ``loss``: the inputs were finite, a loss term was not;
* ``backward``: the loss was finite, the gradient norm was not;
* ``optimizer``: the gradients were finite, the parameters after the step
  were not;
* ``checkpoint``: a checkpoint about to be written held non-finite state.

``forward`` (a non-finite activation before any loss) is not visible to
the guard, which probes no module while training is healthy: the
diagnosis sets it when its replay reproduces the incident and finds one.
Spike incidents (finite values) take the stage of the check that vetoed.
"""

from typing import Any, Dict, Optional

from .finite import json_number
from .step_guard import IterationRecord

STAGES = ('data', 'forward', 'loss', 'backward', 'optimizer', 'checkpoint')

#: ``IterationRecord.veto_stage`` -> stage.
VETO_STAGES = dict(loss='loss', grad='backward')


def live_stage(kind: str, record: IterationRecord) -> Dict[str, Any]:
    """The stage of an incident and the live evidence behind it.

    Args:
        kind (str): The incident kind (``nonfinite_loss``, ...).
        record (IterationRecord): What the step guard saw.

    Returns:
        dict: ``stage`` (one of :data:`STAGES`) and ``live``: ``stage``
        again (the diagnosis may refine the report's), ``inputs_finite``
        (None when the model's batch was not seen), ``loss_finite``,
        ``grad_norm``, ``params_finite`` (None when not checked) and
        ``text`` (one line).
    """
    inputs: Optional[bool] = record.read_inputs_flag()
    loss_finite = not record.loss_nonfinite
    params_finite = False if kind == 'nonfinite_params' else None
    if kind == 'nonfinite_checkpoint':
        stage, text = 'checkpoint', 'the checkpoint state held non-finite'
    elif inputs is False:
        stage = 'data'
        text = 'the inputs after the data preprocessor held non-finite values'
    elif record.loss_nonfinite:
        stage, text = 'loss', 'inputs finite, a loss term non-finite'
    elif record.grad_nonfinite:
        stage = 'backward'
        text = f'loss finite, gradient norm {record.grad_norm}'
    elif kind == 'nonfinite_params':
        stage = 'optimizer'
        text = 'loss and gradients finite, parameters non-finite after step'
    else:
        stage = VETO_STAGES.get(record.veto_stage or '', 'loss')
        text = f'finite values vetoed: {record.veto}'
    if inputs is None and stage != 'checkpoint':
        text += ' (inputs not seen)'
    return dict(
        stage=stage,
        live=dict(
            stage=stage,
            inputs_finite=inputs,
            loss_finite=loss_finite,
            grad_norm=None
            if record.grad_norm is None
            else json_number(record.grad_norm),
            params_finite=params_finite,
            text=text,
        ),
    )
