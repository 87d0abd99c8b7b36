# Copyright (c) mmnanguard contributors. All rights reserved.
"""Build the JSON report of an incident."""

import math
from typing import Any, Dict, List, Optional

import torch

from .finite import json_number


def loss_terms_of(outputs: Optional[Dict[str, Any]]) -> Dict[str, float]:
    """The logged loss terms of ``train_step`` as floats.

    ``outputs`` is the ``log_vars`` dict that ``BaseModel.parse_losses``
    returns: the total ``loss`` and every term (``loss_cls``, ``loss_bbox``,
    ...), as tensors or numbers.
    """
    terms = {}
    for name, value in (outputs or {}).items():
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            terms[name] = float(value.detach())
        elif isinstance(value, (int, float)):
            terms[name] = float(value)
    return terms


def nonfinite_terms(terms: Dict[str, float]) -> Dict[str, Any]:
    """The terms whose value is NaN or infinite."""
    return {k: str(v) for k, v in terms.items() if not math.isfinite(v)}


def samples_of(data_batch: Any) -> List[Dict[str, Any]]:
    """``img_path`` and ``img_id`` of every sample in an mmengine batch."""
    samples = []
    data_samples = (
        data_batch.get('data_samples')
        if isinstance(data_batch, dict)
        else None
    )
    for sample in data_samples or []:
        meta = getattr(sample, 'metainfo', {}) or {}
        samples.append(
            dict(
                img_path=meta.get('img_path'),
                img_id=meta.get('img_id'),
                seg_map_path=meta.get('seg_map_path'),
            )
        )
    return samples


def learning_rates(optim_wrapper) -> Dict[str, List[float]]:
    """``optim_wrapper.get_lr()``: a list of lrs per optimizer key."""
    return {
        k: [float(x) for x in v] for k, v in optim_wrapper.get_lr().items()
    }


def build_report(
    *,
    runner,
    kind: str,
    action: str,
    reason: str,
    terms: Dict[str, float],
    record,
    data_batch: Any,
    local_fault: bool,
    history: List[Dict[str, Any]],
    stage: Optional[Dict[str, Any]] = None,
    extra: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """The incident's ``report.json`` content.

    Args:
        runner (Runner): The runner.
        kind (str): ``'nonfinite_loss'``, ``'nonfinite_grad'``,
            ``'nonfinite_params'`` or ``'nonfinite_checkpoint'``.
        action (str): ``'raise'``, ``'skip'`` or ``'rollback'``.
        reason (str): Why that action (policy, escalation, ...).
        terms (dict): Loss terms of the iteration.
        record (IterationRecord): What the step guard saw.
        data_batch: The batch as the model received it.
        local_fault (bool): Whether this rank saw the value itself.
        history (list): The ring buffer of recent iterations.
        stage (dict, optional): :func:`~.stage.live_stage`'s ``stage``
            (where the first non-finite value was seen) and ``live`` (the
            evidence), written as the report keys of the same names.
        extra (dict, optional): More keys (e.g. non-finite tensor paths).
    """
    from mmengine.dist import get_rank, get_world_size

    report = dict(
        iteration=runner.iter,
        epoch=runner.epoch,
        rank=get_rank(),
        world_size=get_world_size(),
        local_fault=local_fault,
        kind=kind,
        stage=(stage or {}).get('stage'),
        live=(stage or {}).get('live'),
        action=action,
        reason=reason,
        loss_terms={k: json_number(v) for k, v in terms.items()},
        nonfinite_terms=nonfinite_terms(terms),
        grad_norm=None
        if record.grad_norm is None
        else json_number(record.grad_norm),
        lr=learning_rates(runner.optim_wrapper),
        loss_scale=record.loss_scale,
        samples=samples_of(data_batch),
        top_grad_params=record.top_grad_params,
        history=history,
        work_dir=runner.work_dir,
    )
    report.update(extra or {})
    return report


def describe(report: Dict[str, Any]) -> str:
    """One paragraph for logs and exceptions."""
    terms = report['nonfinite_terms']
    terms_txt = ', '.join(f'{k}={v}' for k, v in terms.items()) or 'none'
    path = report.get('report_path') or '(not written: max_incidents)'
    return (
        f"{report['kind']} at iteration {report['iteration']} "
        f"(epoch {report['epoch']}, rank {report['rank']}, stage "
        f"{report.get('stage')}): non-finite "
        f'loss terms: {terms_txt}; grad_norm={report["grad_norm"]}; '
        f"action: {report['action']} ({report['reason']}); "
        f'incident report: {path}'
    )
