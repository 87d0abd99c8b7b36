# Copyright (c) mmnanguard contributors. All rights reserved.
"""Name the cause of an incident from the replay, the data checks and the
history; say where it was first seen (stage) and whether it reproduced.

Every diagnosis has two axes besides the cause:

* ``stage``: where the first non-finite value was seen in the *live*
  iteration (``data``, ``loss``, ``backward``, ``optimizer``,
  ``checkpoint``; see :mod:`mmnanguard.engine.guard.stage`), refined to
  ``forward`` when the replay reproduces the incident and finds a
  non-finite activation before any loss;
* ``reproduced``: whether the replay from the saved state (in the training
  precision) is non-finite again.

Causes, in the order they are tested:

* ``data``: the batch holds an invalid input or target (a non-finite pixel,
  a non-finite or zero-size box, a label out of range, a stray
  segmentation value) and the replay is non-finite;
* ``explosion`` (parameter incidents): the replay is finite and the lr
  was ``explosion_ratio`` times above what the param schedulers
  prescribe: the update itself threw the weights out of range;
* ``recurring``: the replay is finite, but the same samples gave an
  incident of the same kind and stage before (``recurs_after``): a fault
  tied to those samples that the replay from this state does not show;
* ``transient``: the deterministic replay (fp32 too, under AMP) is finite
  where the original step was not, the first time these samples gave
  it: a one-shot fault (its stage still says where the live iteration
  saw it), nondeterminism or hardware;
* ``explosion``: the gradient norm or the loss grew by ``explosion_ratio``
  or more (default: two orders of magnitude) over the buffered iterations,
  or the lr was that far above the schedule (a warmup, step or cosine
  schedule is expected, however fast it rises), or the replayed gradients
  are finite element by element while their norm overflows float32;
* ``forward`` (overflow): the first module whose output left the normal
  range (:mod:`.magnitude`) has weights out of range: the inf that a loss
  shows later is that module's;
* ``forward``: the first non-finite activation, at a module; or every
  activation finite and a buffer the forward writes (BatchNorm's running
  variance) non-finite;
* ``loss``: every activation finite, a loss term non-finite;
* ``backward``: the loss finite, a gradient non-finite;
* ``optimizer`` (parameter incidents only): the replayed gradients are
  finite but the optimizer state is not.
"""

from typing import Any, Dict, List, Optional

from ..incident import Cause, IncidentKind, ReportData
from .explosion import grad_norm_growth, loss_growth, lr_off_schedule
from .finding_words import describe_finding
from .replay import ReplayResult
from .tree import describe_values

#: The causes, as :class:`~mmnanguard.engine.incident.Cause` names them.
CAUSES = tuple(c.value for c in Cause)


def _fmt(value: Any) -> str:
    return f'{value:.3g}' if isinstance(value, float) else str(value)


def _forward_text(first: Dict[str, Any]) -> str:
    made = (
        'from finite inputs'
        if first['inputs_finite']
        else 'from non-finite inputs'
    )
    return (
        f"the first non-finite activation is the output of module "
        f"`{first['module']}` ({first['type']}), {made}: its output"
        f"{'' if first['path'] == '(output)' else ' ' + first['path']} "
        f'holds {describe_values(first)}'
    )


def _buffers_text(replay: ReplayResult) -> str:
    names = ', '.join(f'`{n}`' for n in replay.nonfinite_buffers[:3])
    more = len(replay.nonfinite_buffers) - 3
    text = (
        f'every activation is finite, but the forward writes non-finite '
        f"buffers: {names}{f' (and {more} more)' if more > 0 else ''}"
    )
    first = replay.magnitude_first
    if first:
        text += (
            f"; the magnitudes leave the normal range at module "
            f"`{first['module']}` ({first['type']}): its {first['reason']}"
        )
    return text


def _loss_text(replay: ReplayResult) -> str:
    terms = (
        ', '.join(
            f'{k}={replay.loss_terms[k]}'
            for k in replay.nonfinite_terms
            if k != 'loss'
        )
        or 'loss'
    )
    where = ''
    if replay.loss_first:
        where = (
            f" (first non-finite loss module: "
            f"`{replay.loss_first['module']}` "
            f"({replay.loss_first['type']}))"
        )
    return (
        f'every activation is finite, the loss term(s) {terms} are '
        f'not{where}'
    )


def norm_overflow(replay: ReplayResult) -> bool:
    """Whether every gradient element is finite but their norm is not."""
    return (
        replay.backward_ran
        and isinstance(replay.grad_norm, str)
        and not (replay.grad_first or replay.param_grads or replay.anomaly)
        and all(replay.term_grads.values())
    )


def _backward_text(replay: ReplayResult) -> str:
    bad_terms = [k for k, ok in replay.term_grads.items() if not ok]
    parts = ['the loss is finite, its gradient is not']
    if bad_terms:
        parts.append(
            f"the gradient of loss term {', '.join(bad_terms)} "
            'is non-finite'
        )
    if replay.grad_first:
        parts.append(
            f"first non-finite output gradient (backward order) at "
            f"module `{replay.grad_first['module']}`"
        )
    if replay.param_grads:
        names = ', '.join(f"`{p['name']}`" for p in replay.param_grads[:3])
        parts.append(f'first non-finite parameter gradients: {names}')
    if not replay.grad_first and replay.param_grads:
        module = replay.param_grads[0]['name'].rsplit('.', 1)[0]
        parts.append(
            f'so the gradient is non-finite first at module ' f'`{module}`'
        )
    if replay.anomaly:
        parts.append(replay.anomaly.splitlines()[0])
    return '; '.join(parts)


#: Stage of an incident kind, for reports written without one.
KIND_STAGES = dict(
    nonfinite_loss='loss',
    nonfinite_grad='backward',
    nonfinite_params='optimizer',
    nonfinite_buffers='forward',
    nonfinite_checkpoint='checkpoint',
)


def _stage(report: ReportData, replay: ReplayResult) -> str:
    stage = (
        (report.get('live') or {}).get('stage')
        or report.get('stage')
        or KIND_STAGES.get(report['kind'], 'loss')
    )
    if stage == 'loss' and not replay.finite and replay.forward_first:
        return 'forward'  # reproduced: the live forward had it as well
    return stage


def _transient_text(report: ReportData, stage: str) -> str:
    live = (report.get('live') or {}).get('text')
    seen = f' ({live})' if live else ''
    return (
        f'the live iteration saw it at stage `{stage}`{seen}, but the '
        'deterministic replay of the same batch from the same state and '
        'RNG is finite: a one-shot fault, nondeterminism or hardware'
    )


def _recurring_text(
    report: ReportData, stage: str, earlier: Dict[str, Any]
) -> str:
    return (
        f"the same samples gave the same incident at iteration "
        f"{earlier['iteration']} ({earlier['folder']}), and the live "
        f'iteration saw it at stage `{stage}` again; the replay of the batch '
        'from this state is finite, so the fault is tied to these samples '
        'but depends on the state or the draw (BatchNorm statistics, the '
        'weights at the time, a random augmentation): not a one-shot fault'
    )


def _explosion_text(
    growth: Optional[Dict[str, Any]],
    loss: Optional[Dict[str, Any]],
    lr: Optional[Dict[str, Any]],
    ratio: float,
) -> Optional[str]:
    if growth and growth['ratio'] >= ratio:
        return (
            f"the gradient norm grew {growth['ratio']:.3g}x, from "
            f"{_fmt(growth['from_norm'])} (iteration "
            f"{growth['from_iter']}) to {_fmt(growth['to_norm'])} "
            f"(iteration {growth['to_iter']}), before it became non-finite"
        )
    if loss and loss['ratio'] >= ratio:
        return (
            f"the loss grew {loss['ratio']:.3g}x, from "
            f"{_fmt(loss['from_value'])} (iteration {loss['from_iter']}) "
            f"to {_fmt(loss['to_value'])} (iteration {loss['to_iter']}), "
            'before it became non-finite'
        )
    if lr and lr['ratio'] >= ratio:
        return (
            f"the learning rate{_group_words(lr)} at iteration "
            f"{lr['iteration']} was "
            f"{_fmt(lr['lr'])}, {lr['ratio']:.3g}x what the param "
            f"schedulers prescribe ({_fmt(lr['lr_scheduled'])}): one "
            'finite update threw the weights out of range'
        )
    return None


def _group_words(off: Dict[str, Any]) -> str:
    """``' of param group 3'`` when the lr check names a group."""
    group = off.get('group')
    return '' if group is None else f' of param group {group}'


def _overflow_text(first: Dict[str, Any]) -> str:
    return (
        f"the magnitudes leave the normal range at module "
        f"`{first['module']}` ({first['type']}): its {first['reason']}, "
        f"and its weights are out of range (max |w| "
        f"{_fmt(first['weight_max'])}); the non-finite values downstream "
        'are its overflow'
    )


def classify(
    report: ReportData,
    findings: List[Dict[str, Any]],
    replay: ReplayResult,
    fp32: Optional[ReplayResult] = None,
    explosion_ratio: float = 100.0,
    optimizer_nonfinite: Optional[List[str]] = None,
    recurs_after: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """The cause, the stage and the evidence of an incident.

    Args:
        report (dict): The incident's ``report.json`` content (``stage``
            and ``live`` as the guard wrote them, ``history``).
        findings (list[dict]): :func:`check_batch`'s findings.
        replay (ReplayResult): The replay in the training precision.
        fp32 (ReplayResult, optional): The fp32 replay (AMP runs only).
        explosion_ratio (float): Growth of the gradient norm or the loss,
            or lr over the schedule, that counts as an explosion.
        optimizer_nonfinite (list[str], optional): Non-finite optimizer
            state entries (parameter incidents).
        recurs_after (dict, optional): The earlier diagnosis of the same
            samples, kind and stage (``folder``, ``iteration``): a finite
            replay is then ``recurring``, never ``transient``.

    Returns:
        dict: ``cause`` (one of :data:`CAUSES`), ``stage``, ``reproduced``
        (bool), ``summary`` (one line), ``fp16_overflow`` (bool), and
        ``evidence`` (``data``, ``replay``, ``fp32_replay``,
        ``grad_norm_growth``, ``loss_growth``, ``lr_schedule``,
        ``optimizer_state``, ``live``).
    """
    history, iteration = report.get('history', []), report['iteration']
    growth = grad_norm_growth(history, iteration)
    loss = loss_growth(history, iteration)
    lr = lr_off_schedule(history, iteration)
    fp16_overflow = bool(
        fp32 is not None and not replay.finite and fp32.finite
    )
    evidence: Dict[str, Any] = dict(
        data=[dict(f, text=describe_finding(f)) for f in findings],
        replay=replay.to_dict(),
        fp32_replay=fp32.to_dict() if fp32 is not None else None,
        grad_norm_growth=growth,
        loss_growth=loss,
        lr_schedule=lr,
        optimizer_state=optimizer_nonfinite or [],
        live=report.get('live'),
    )
    stage = _stage(report, replay)
    replays_finite = replay.finite and (fp32 is None or fp32.finite)
    exploded = _explosion_text(growth, loss, lr, explosion_ratio)
    lr_text = _explosion_text(None, None, lr, explosion_ratio)
    overflow = replay.magnitude_first
    if findings and not replay.finite:
        cause = Cause.DATA
        summary = (
            f'invalid data in the batch: ' f'{evidence["data"][0]["text"]}'
        )
        if len(findings) > 1:
            summary += f' (and {len(findings) - 1} more)'
        reached = [k for k in replay.nonfinite_terms if k != 'loss']
        if reached:
            summary += f"; it makes {', '.join(reached)} non-finite"
        if replay.exception:
            summary += (
                f'; it makes the {replay.exception_stage} raise '
                f"{replay.exception.split(':')[0]}"
            )
    elif (
        replays_finite
        and report.get('kind') == IncidentKind.NONFINITE_PARAMS
        and optimizer_nonfinite
    ):
        cause = Cause.OPTIMIZER
        summary = (
            'the replayed gradients are finite, the optimizer state '
            f'is not: {", ".join(optimizer_nonfinite[:3])}'
        )
    elif (
        replays_finite
        and report.get('kind') == IncidentKind.NONFINITE_PARAMS
        and lr_text
    ):
        cause, summary = Cause.EXPLOSION, lr_text
    elif replays_finite and recurs_after is not None:
        cause = Cause.RECURRING
        summary = _recurring_text(report, stage, recurs_after)
    elif replays_finite:
        cause = Cause.TRANSIENT
        summary = _transient_text(report, stage)
    elif exploded:
        cause, summary = Cause.EXPLOSION, exploded
    elif overflow and overflow['weights_out_of_range']:
        cause = Cause.FORWARD
        summary = _overflow_text(overflow)
    elif norm_overflow(replay):
        cause = Cause.EXPLOSION
        top = ', '.join(
            f"`{t['name']}` ({_fmt(t['grad_norm'])})" for t in replay.top_grads
        )
        start = (
            f"from {_fmt(growth['from_norm'])} (iteration "
            f"{growth['from_iter']}) "
            if growth
            else ''
        )
        summary = (
            'every gradient element is finite, but the gradient norm grew '
            f'{start}past the float32 range (it overflows to '
            f'{replay.grad_norm}); largest: {top}'
        )
    elif replay.forward_first:
        cause = Cause.FORWARD
        summary = _forward_text(replay.forward_first)
    elif replay.nonfinite_buffers:
        cause = Cause.FORWARD
        summary = _buffers_text(replay)
    elif replay.nonfinite_terms or replay.loss_first:
        cause = Cause.LOSS
        summary = _loss_text(replay)
    else:
        cause = Cause.BACKWARD
        summary = _backward_text(replay)
    if fp16_overflow:
        summary += (
            f' -- in {replay.precision} only: the fp32 replay is '
            'finite (fp16 overflow, not a math error)'
        )
    return dict(
        cause=cause,
        stage=stage,
        reproduced=not replay.finite,
        summary=summary,
        fp16_overflow=fp16_overflow,
        evidence=evidence,
    )
