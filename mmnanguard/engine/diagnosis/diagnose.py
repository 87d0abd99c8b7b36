# Copyright (c) mmnanguard contributors. All rights reserved.
"""Diagnose one incident: check the batch, replay it, name the cause and
write ``report.json`` (``cause``, ``evidence``, ``diagnosis``),
``report.md`` and ``timeline.png``."""

import math
from typing import Any, Dict, List, Optional

import torch
from torch import nn

from mmnanguard.models.loss_kind import (
    describe_mismatch,
    encoded_deltas_into_box_loss,
)

from ..guard.dtensor import local
from ..incident import (
    Cause,
    IncidentReport,
    ReportData,
    Stage,
    write_report_json,
)
from .batch_checks import check_batch, model_classes
from .classify import classify
from .ctc_alignment import name_samples
from .drop_ins import box_coders, loss_modules, module_entry
from .outcome import Diagnosis
from .remedy import remedies
from .replay import ReplayResult, replay_batch
from .report_md import verdict_lines, write_markdown
from .timeline import write_timeline


def module_weight_stats(model: nn.Module, name: str) -> Dict[str, Any]:
    """Largest absolute parameter value of module ``name`` (its own
    parameters and its children's; a sharded one's part on this rank)."""
    params = (local(p) for p in model.get_submodule(name).parameters())
    values = [p.detach().abs().max() for p in params if p.numel()]
    top = float(torch.stack(values).max()) if values else math.nan
    return dict(module=name, max_abs=f'{top:.3g}')


def encoded_deltas_evidence(model: nn.Module) -> List[Dict[str, Any]]:
    """The heads that feed encoded deltas to a box loss
    (``reg_decoded_bbox=False`` with an IoU or Gaussian loss, see
    :func:`~mmnanguard.models.loss_kind.encoded_deltas_into_box_loss`),
    each with ``fix``: the sentence naming ``reg_decoded_bbox=True``."""
    return [
        dict(record._asdict(), fix=describe_mismatch(record))
        for record in encoded_deltas_into_box_loss(model)
    ]


def _bad_terms(replay: ReplayResult) -> List[str]:
    """Terms that are non-finite, or whose gradient is."""
    bad = [t for t in replay.nonfinite_terms if t != 'loss']
    return bad + [k for k, ok in replay.term_grads.items() if not ok]


def _add_module_evidence(
    model: nn.Module,
    evidence: Dict[str, Any],
    replay: ReplayResult,
    fp32: Optional[ReplayResult],
) -> None:
    """The loss modules and box coders of the terms that went non-finite,
    and the weights of the first non-finite module, as found in the
    model."""
    terms = _bad_terms(replay) + (_bad_terms(fp32) if fp32 else [])
    evidence['loss_modules'] = loss_modules(model, list(dict.fromkeys(terms)))
    evidence['box_coders'] = box_coders(model)
    evidence['loss_first_module'] = (
        module_entry(model, replay.loss_first['module'])
        if replay.loss_first
        else None
    )
    if replay.forward_first:
        evidence['module_weights'] = [
            module_weight_stats(model, replay.forward_first['module'])
        ]


def diagnose(
    model: nn.Module,
    report: ReportData,
    batch: Dict[str, Any],
    replay_state: str,
    amp_dtype: Optional[torch.dtype] = None,
    loss_scale: Optional[float] = None,
    fp32_replay: bool = True,
    anomaly: bool = False,
    explosion_ratio: float = 100.0,
    optimizer_nonfinite: Optional[List[str]] = None,
    recurs_after: Optional[Dict[str, Any]] = None,
) -> Diagnosis:
    """Name the cause of an incident (``report`` is read, not changed:
    :meth:`Diagnosis.apply_to` adds what was found).

    Args:
        model (nn.Module): The model to replay on, already in the state to
            replay from. It is run in train mode and its BatchNorm
            statistics change: during training, use it inside
            :func:`replay_model`, which restores the state afterwards.
        report (IncidentReport | dict): The incident's report (live, or
            ``report.json`` read back).
        batch (dict): ``data_batch`` and ``rng_state`` (``batch.pth``).
        replay_state (str): Where the replayed weights come from, for the
            report.
        amp_dtype (torch.dtype, optional): Replay under autocast with this
            dtype (the run used AMP).
        loss_scale (float, optional): The GradScaler's scale (AMP).
        fp32_replay (bool): Under AMP, also replay in fp32.
        anomaly (bool): Replay under ``torch.autograd.detect_anomaly``.
        explosion_ratio (float): Growth of the grad norm that counts as an
            explosion.
        optimizer_nonfinite (list[str], optional): Non-finite optimizer
            state entries.
        recurs_after (dict, optional): The earlier diagnosis of the same
            samples, kind and stage (see :func:`classify`).

    Returns:
        Diagnosis: ``cause``, ``stage`` (refined, see :func:`classify`),
        ``reproduced``, ``evidence`` and ``diagnosis`` (``summary``,
        ``verdict``, ``remedy``, ``replay_state``, ``fp16_overflow``).
    """
    num_classes, ignore_index = model_classes(model)
    rng_state = batch.get('rng_state')
    first = replay_batch(
        model, batch['data_batch'], rng_state, amp_dtype, loss_scale, anomaly
    )
    replay = first['result']
    replay.ctc_unaligned = name_samples(
        replay.ctc_unaligned, batch['data_batch']
    )
    fp32 = None
    if amp_dtype is not None and fp32_replay:
        fp32 = replay_batch(
            model, batch['data_batch'], rng_state, None, None, anomaly
        )['result']
    findings = check_batch(
        batch['data_batch'],
        first['preprocessed'],
        num_classes,
        ignore_index,
        ann_file=report.get('ann_file'),
    )
    result = classify(
        report,
        findings,
        replay,
        fp32,
        explosion_ratio,
        optimizer_nonfinite,
        recurs_after,
    )
    evidence = result['evidence']
    evidence['num_classes'] = num_classes
    evidence['lr'] = report.get('lr')
    _add_module_evidence(model, evidence, replay, fp32)
    try:
        evidence['encoded_deltas'] = encoded_deltas_evidence(model)
    except Exception as err:  # noqa: BLE001  (the rest still stands)
        evidence['encoded_deltas'] = []
        evidence['encoded_deltas_error'] = f'{type(err).__name__}: {err}'
    if evidence['encoded_deltas'] and result['cause'] != Cause.DATA:
        first = evidence['encoded_deltas'][0]
        result['summary'] += (
            f"; {first['head']}.{first['loss_name']} ({first['loss_type']}) "
            'takes boxes but is fed encoded deltas (reg_decoded_bbox=False)'
        )
    found = Diagnosis(
        cause=Cause(result['cause']),
        stage=Stage.coerce(result['stage'], 'stage'),
        reproduced=result['reproduced'],
        evidence=evidence,
        diagnosis=dict(
            summary=result['summary'],
            fp16_overflow=result['fp16_overflow'],
            replay_state=replay_state,
            remedy=remedies(result, replay),
        ),
    )
    # the verdict reads the report as it will be, with these fields
    completed = {**_plain(report), **found.fields()}
    found.diagnosis['verdict'] = verdict_lines(completed)
    return found


def _plain(report: ReportData) -> Dict[str, Any]:
    """``report`` as a dict (a live report's ``report.json`` fields)."""
    return report.to_dict() if isinstance(report, IncidentReport) else report


def write_diagnosis_files(report: ReportData, folder: str) -> Dict[str, str]:
    """Write ``report.md`` and ``timeline.png`` (the incident's own
    ``report.json`` is the recorder's to write, once).

    Returns:
        dict: The paths, by file name.
    """
    return {
        'report.md': write_markdown(report, folder),
        'timeline.png': write_timeline(report, folder),
    }


def write_diagnosis(report: ReportData, folder: str) -> Dict[str, str]:
    """Rewrite ``report.json`` of an existing incident folder with the
    diagnosis, and write ``report.md`` and ``timeline.png`` (an offline
    replay's ``--write``).

    Returns:
        dict: The paths, by file name.
    """
    return {
        'report.json': write_report_json(report, folder),
        **write_diagnosis_files(report, folder),
    }
