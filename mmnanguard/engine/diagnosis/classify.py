# Copyright (c) mmnanguard contributors. All rights reserved.
"""Name the cause of an incident from the replay, the data checks and the
history.

Causes, in the order they are tested:

* ``data``: the batch holds an invalid input or target (a non-finite pixel,
  a non-finite or zero-size box, a label out of range, a stray
  segmentation value) and the replay is non-finite;
* ``transient``: the deterministic replay (fp32 too, under AMP) is finite
  where the original step was not: nondeterminism or hardware;
* ``explosion``: the gradient norm grew by ``explosion_ratio`` or more
  (default: two orders of magnitude) over the buffered iterations before
  it became non-finite, or the learning rate rose by that factor (one
  update threw the weights out of range), or the replayed gradients are
  finite element by element while their norm overflows float32;
* ``forward``: the first non-finite activation, at a module;
* ``loss``: every activation finite, a loss term non-finite;
* ``backward``: the loss finite, a gradient non-finite;
* ``optimizer`` (parameter incidents only): the replayed gradients are
  finite but the optimizer state is not.
"""

from typing import Any, Dict, List, Optional

from .batch_checks import describe_finding
from .explosion import grad_norm_growth, lr_jump
from .replay import ReplayResult
from .tree import describe_values

CAUSES = (
    'data',
    'transient',
    'explosion',
    'forward',
    'loss',
    'backward',
    'optimizer',
)


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


def classify(
    report: Dict[str, Any],
    findings: List[Dict[str, Any]],
    replay: ReplayResult,
    fp32: Optional[ReplayResult] = None,
    explosion_ratio: float = 100.0,
    optimizer_nonfinite: Optional[List[str]] = None,
) -> Dict[str, Any]:
    """The cause and the evidence of an incident.

    Args:
        report (dict): The incident's ``report.json`` content.
        findings (list[dict]): :func:`check_batch`'s findings.
        replay (ReplayResult): The replay in the training precision.
        fp32 (ReplayResult, optional): The fp32 replay (AMP runs only).
        explosion_ratio (float): Gradient-norm growth that counts as an
            explosion.
        optimizer_nonfinite (list[str], optional): Non-finite optimizer
            state entries (parameter incidents).

    Returns:
        dict: ``cause`` (one of :data:`CAUSES`), ``summary`` (one line),
        ``fp16_overflow`` (bool), and ``evidence`` (``data``, ``replay``,
        ``fp32_replay``, ``grad_norm_growth``, ``optimizer_state``).
    """
    growth = grad_norm_growth(report.get('history', []), report['iteration'])
    jump = lr_jump(report.get('history', []), report['iteration'])
    fp16_overflow = bool(
        fp32 is not None and not replay.finite and fp32.finite
    )
    evidence = dict(
        data=[dict(f, text=describe_finding(f)) for f in findings],
        replay=replay.to_dict(),
        fp32_replay=fp32.to_dict() if fp32 is not None else None,
        grad_norm_growth=growth,
        lr_jump=jump,
        optimizer_state=optimizer_nonfinite or [],
    )
    replays_finite = replay.finite and (fp32 is None or fp32.finite)
    if findings and not replay.finite:
        cause = 'data'
        summary = (
            f'invalid data in the batch: ' f'{evidence["data"][0]["text"]}'
        )
        if len(findings) > 1:
            summary += f' (and {len(findings) - 1} more)'
        reached = [k for k in replay.nonfinite_terms if k != 'loss']
        if reached:
            summary += f"; it makes {', '.join(reached)} non-finite"
    elif (
        replays_finite
        and report.get('kind') == 'nonfinite_params'
        and optimizer_nonfinite
    ):
        cause = 'optimizer'
        summary = (
            'the replayed gradients are finite, the optimizer state '
            f'is not: {", ".join(optimizer_nonfinite[:3])}'
        )
    elif replays_finite:
        cause = 'transient'
        summary = (
            'the deterministic replay of the same batch from the same '
            'state and RNG is finite, the original step was not: '
            'nondeterminism or hardware'
        )
    elif growth and growth['ratio'] >= explosion_ratio:
        cause = 'explosion'
        summary = (
            f"the gradient norm grew {growth['ratio']:.3g}x, from "
            f"{_fmt(growth['from_norm'])} (iteration "
            f"{growth['from_iter']}) to {_fmt(growth['to_norm'])} "
            f"(iteration {growth['to_iter']}), before it became "
            f"non-finite; lr {_fmt(growth['lr_from'])} -> "
            f"{_fmt(growth['lr_to'])}"
        )
    elif jump and jump['ratio'] >= explosion_ratio:
        cause = 'explosion'
        summary = (
            f"the learning rate jumped {jump['ratio']:.3g}x, from "
            f"{_fmt(jump['from_lr'])} (iteration {jump['from_iter']}) to "
            f"{_fmt(jump['to_lr'])} (iteration {jump['to_iter']}): one "
            'finite update threw the weights out of range'
        )
    elif norm_overflow(replay):
        cause = 'explosion'
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
        cause = 'forward'
        summary = _forward_text(replay.forward_first)
    elif replay.nonfinite_terms or replay.loss_first:
        cause = 'loss'
        summary = _loss_text(replay)
    else:
        cause = 'backward'
        summary = _backward_text(replay)
    if fp16_overflow:
        summary += (
            f' -- in {replay.precision} only: the fp32 replay is '
            'finite (fp16 overflow, not a math error)'
        )
    return dict(
        cause=cause,
        summary=summary,
        fp16_overflow=fp16_overflow,
        evidence=evidence,
    )
