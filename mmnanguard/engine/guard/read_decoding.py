# Copyright (c) mmnanguard contributors. All rights reserved.
"""The step's one host read, decoded into a :class:`StepVerdict`.

:meth:`StepGuard.read <.step_guard.StepGuard.read>` stacks every check of
the step into one vector, names each part's slice in a layout and reads
the vector once (``.tolist()``). :func:`decode_read` turns those floats
into the verdict: the rank's own flags, then, under ``torch.distributed``,
the flags every rank agreed on in the ``all_reduce`` (read by name through
:class:`AgreedFlags`). It reads nothing more from the device and keeps no
state.
"""

import math
from typing import Dict, List, Optional, Sequence

from torch import Tensor

from .agreed_flags import AgreedFlags
from .spike_detector import SpikeCheck, SpikeDetector
from .verdict import GradHolder, StepVerdict


def decode_read(
    host: List[float],
    layout: Dict[str, slice],
    *,
    iteration: int,
    terms: Dict[str, Tensor],
    check: Optional[SpikeCheck],
    detector: Optional[SpikeDetector],
    vote_names: List[str],
    params_iteration: Optional[int],
    norms: Optional[Tensor],
    grad_params: List[GradHolder],
) -> StepVerdict:
    """The verdict that the read ``host`` holds.

    Args:
        host (list[float]): The read vector; ``host[0]`` is the gradient
            norm.
        layout (dict): ``part name -> slice`` of ``host`` (``loss``
            always; ``params``, ``inputs``, ``buffers``, ``local_grad``,
            ``terms``, ``amp``, ``votes``, ``agreed`` and the spike parts
            when they were read).
        iteration (int): The iteration of the step.
        terms (dict): The loss terms whose values are ``layout['terms']``,
            in order.
        check (SpikeCheck, optional): The spike check that was read.
        detector (SpikeDetector, optional): The detector that made it.
        vote_names (list[str]): The names of the host votes, in order.
        params_iteration (int, optional): The iteration whose step the
            parameter check (``layout['params']``) checked.
        norms (Tensor, optional): The per-parameter gradient norms (for a
            report; not read).
        grad_params (list): The parameters that had a gradient.

    Returns:
        StepVerdict: The verdict, before the step guard's own state (the
        parameter check of another wrapper, restored buffers, vetoes).
    """

    def part(name: str) -> Optional[List[float]]:
        return host[layout[name]] if name in layout else None

    total = host[0]
    loss_bad, first_bad = host[layout['loss']]
    grad_bad = not math.isfinite(total)
    # folded: the total is the global one; this rank's shards apart
    local_grad = part('local_grad')
    local_grad_bad = bool(local_grad[0]) if local_grad else grad_bad
    params = part('params')
    params_bad = bool(params[0]) if params else None
    buffers = part('buffers')
    amp = part('amp')
    inputs = part('inputs')
    verdict = StepVerdict(
        iteration=iteration,
        loss_finite=not loss_bad,
        loss_bad_iteration=int(first_bad) if loss_bad else None,
        grad_norm=total,
        grad_finite=not grad_bad,
        params_finite=None if params_bad is None else not params_bad,
        params_iteration=params_iteration,
        inputs_finite=bool(inputs[0]) if inputs is not None else None,
        buffers_finite=None if buffers is None else not buffers[0],
        loss_terms=dict(zip(terms, part('terms') or [])),
        local_loss_finite=not loss_bad,
        local_grad_finite=not local_grad_bad,
        local_params_finite=None if params_bad is None else not params_bad,
        grad_norms=norms,
        grad_params=grad_params,
    )
    if amp is not None:
        verdict.amp_raw = (bool(amp[0]), amp[1], int(amp[2]))
        verdict.grad_finite = not amp[0]
        verdict.local_grad_finite = not amp[0]
    if check is not None and detector is not None:  # one with the other
        verdict.spikes = check.spikes(
            host[layout['spike_flags']],
            host[layout['spike_values']],
            host[layout['spike_refs']],
            detector.settings.factor,
        )
        verdict.spike_acts = detector.acts
    votes: Optional[Sequence[float]] = part('votes')
    agreed = part('agreed')
    if agreed is not None and votes is not None:
        votes = AgreedFlags.votes(agreed, len(votes))
    verdict.votes = {n: bool(v) for n, v in zip(vote_names, votes or [])}
    if agreed is not None:
        _apply_agreed(
            verdict, AgreedFlags.view(agreed), amp is not None, grad_bad
        )
    return verdict


def _apply_agreed(
    verdict: StepVerdict,
    seen: 'AgreedFlags[float]',
    amp: bool,
    grad_bad: bool,
) -> None:
    """Put what every rank agreed on (``seen``: the summed flags, by name)
    into ``verdict``; ``grad_bad``: this rank read a non-finite norm."""
    verdict.loss_finite = not seen.loss
    if verdict.loss_bad_iteration is None and seen.loss:
        verdict.loss_bad_iteration = verdict.iteration
    verdict.grad_finite = not (seen.amp_inf if amp else seen.grad or grad_bad)
    if verdict.params_finite is not None:
        verdict.params_finite = not seen.params
    if verdict.buffers_finite is not None:
        verdict.buffers_finite = not seen.buffers
    # under action='log' the rank that saw the spike steps too
    if seen.spike and not verdict.spikes and verdict.spike_acts:
        verdict.veto = 'a spike on another rank'
