# Copyright (c) mmnanguard contributors. All rights reserved.
"""Build the :class:`IncidentReport` of an incident from what the guard
read."""

import math
from typing import Any, Dict, List, Optional

from mmengine.dist import get_rank, get_world_size

from mmnanguard.datasets.annotation_records import annotation_file_of

from ..incident import (
    IncidentAction,
    IncidentKind,
    IncidentReport,
    json_number,
)
from ..incident.batch_layout import sample_sources
from .stage import live_stage
from .verdict import StepVerdict


def nonfinite_terms(terms: Dict[str, float]) -> Dict[str, str]:
    """The terms whose value is NaN or infinite."""
    return {k: str(v) for k, v in terms.items() if not math.isfinite(v)}


def samples_of(data_batch: Any) -> List[Dict[str, Any]]:
    """``img_path``, ``img_id`` and ``seg_map_path`` of every sample in an
    mmengine batch, in either batch layout
    (:func:`~mmnanguard.engine.incident.batch_layout.sample_sources`)."""
    return sample_sources(data_batch)


def learning_rates(optim_wrapper) -> Dict[str, List[float]]:
    """The live lr of every param group, per optimizer key (``'lr'``, or
    ``'<name>.lr'`` for an ``OptimWrapperDict``), read from the param
    groups (no device value). ``get_lr()``'s ``base_lr`` entry, which
    mmengine keeps for schedulers when there are several groups, is not
    a live lr and is left out."""
    return {
        k: [float(x) for x in v]
        for k, v in optim_wrapper.get_lr().items()
        if not k.endswith('base_lr')
    }


def build_report(
    *,
    runner,
    kind: IncidentKind,
    action: IncidentAction,
    reason: str,
    iteration: int,
    verdict: Optional[StepVerdict],
    data_batch: Any,
    history: List[Dict[str, Any]],
    top_grad_params: Optional[List[Dict[str, Any]]] = None,
    **extra: Any,
) -> IncidentReport:
    """The incident's report.

    Args:
        runner (Runner): The runner.
        kind (IncidentKind): What went wrong.
        action (str): ``'raise'``, ``'skip'`` or ``'rollback'``.
        reason (str): Why that action (policy, escalation, ...).
        iteration (int): The iteration whose update was bad.
        verdict (StepVerdict, optional): What the step's read said.
        data_batch: The batch of ``iteration`` as the dataloader gave it.
        history (list): The ring buffer of recent iterations.
        top_grad_params (list, optional): Parameters by gradient norm.
        **extra: More fields of :class:`IncidentReport` (``spikes``,
            ``nonfinite_tensors``, ``detected_at``).
    """
    v = verdict
    terms = dict(v.loss_terms) if v is not None else {}
    kind = IncidentKind(kind)
    local = True
    if v is not None:
        local = (
            not v.local_loss_finite
            or not v.local_grad_finite
            or v.local_params_finite is False
            or bool(v.restored_buffers)
            or bool(v.spikes)
            or kind is IncidentKind.NONFINITE_CHECKPOINT
        )
    stage = live_stage(kind, v)
    return IncidentReport(
        iteration=iteration,
        epoch=runner.epoch,
        kind=kind,
        action=action,
        reason=reason,
        rank=get_rank(),
        world_size=get_world_size(),
        local_fault=local,
        stage=stage['stage'],
        live=stage['live'],
        loss_terms={k: json_number(x) for k, x in terms.items()},
        nonfinite_terms=nonfinite_terms(terms),
        grad_norm=None
        if v is None or v.grad_norm is None or kind.weights_damaged
        else json_number(v.grad_norm),
        lr=learning_rates(runner.optim_wrapper),
        loss_scale=None if v is None or v.amp is None else v.amp.scale_after,
        samples=samples_of(data_batch),
        top_grad_params=top_grad_params or [],
        history=history,
        work_dir=runner.work_dir,
        ann_file=train_ann_file(runner),
        restored_buffers=(v.restored_buffers or None) if v else None,
        **extra,
    )


def train_ann_file(runner) -> Optional[str]:
    """The training dataset's annotation file, or None."""
    loader = getattr(getattr(runner, 'train_loop', None), 'dataloader', None)
    return annotation_file_of(getattr(loader, 'dataset', None))
