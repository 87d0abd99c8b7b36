# Copyright (c) mmnanguard contributors. All rights reserved.
"""NanDiagnosisHook: name the first module, loss term and sample that went
non-finite, where and why, for every distinct incident."""

import os.path as osp
import traceback
from typing import Optional

import torch
from mmengine.hooks import Hook

from mmnanguard.registry import HOOKS, register_shared

from ..diagnosis import (
    amp_settings,
    diagnose,
    replay_model,
    write_diagnosis_files,
)
from ..diagnosis.distinct import DiagnosisLog
from ..diagnosis.replay_state import replay_unavailable
from ..diagnosis.report_md import write_repeat_markdown
from ..guard.finite import nonfinite_paths
from ..guard.incident_event import IncidentEvent
from ..incident import (
    CONFIG_NAME,
    MODEL_NAME,
    Cause,
    IncidentAction,
    IncidentKind,
    write_incident_file,
)
from .nanguard_hook import NanGuardHook


@register_shared(HOOKS)
class NanDiagnosisHook(Hook):
    """Replay the batch of an incident with every module probed.

    In ``before_train`` the hook finds the runner's :class:`NanGuardHook`
    and subscribes to its incident events (:meth:`NanGuardHook.subscribe`).
    Nothing else runs while training is healthy: no module carries a hook
    and no stage of this hook is called per iteration.

    On every distinct incident, up to ``max_diagnoses``, and always on the
    incident that stops training (an incident is distinct when its samples,
    kind or live stage differ from one already diagnosed, see
    :mod:`mmnanguard.engine.diagnosis.distinct`), the listener replays the
    incident's batch on the model (state, gradients and modes restored
    afterwards), from the state just before the bad update (see
    :mod:`mmnanguard.engine.diagnosis.replay_state`) with the saved RNG states,
    under forward hooks and output-gradient hooks on every module; checks the
    batch's pixels, boxes, labels and segmentation maps; under AMP replays once
    more in fp32; and classifies the cause (``data``, ``forward``, ``loss``,
    ``backward``, ``explosion``, ``transient``, ``recurring``, ``optimizer``),
    the ``stage`` and whether the replay ``reproduced`` it. It puts
    ``cause``, ``stage``, ``reproduced``, ``evidence`` and ``diagnosis`` into
    the report, adds ``report.md`` and ``timeline.png``, and, for
    ``tools/replay.py``, the run's config (``config.py``) and the replayed
    weights (``model.pth``, a plain state dict) to the incident folder. It
    runs while the folder is written, under its temporary name: the folder
    appears with ``report.json`` complete, written once (see
    :class:`~mmnanguard.engine.guard.incident_event.ListenersTurn`). The
    verdict is logged as an error. A repeat of a diagnosed incident gets
    ``repeat_of`` (the earlier folder, iteration, cause and stage) in its
    ``report.json`` and a ``report.md`` saying so, without a replay; a repeat
    of one diagnosed ``transient`` is diagnosed again, and a finite replay is
    then ``recurring``: a fault that comes back with the same samples is never
    a one-shot fault.

    A diagnosis that fails is logged with its traceback and recorded as
    ``diagnosis_error`` in ``report.json``; training goes on under the
    guard's policy.

    Args:
        max_diagnoses (int): Distinct incidents diagnosed at most.
            Defaults to 5.
        fp32_replay (bool): Under AMP, also replay in fp32 (tells an fp16
            overflow from a math error). Defaults to True.
        anomaly (bool): Replay under ``torch.autograd.detect_anomaly`` (the
            failing backward op and its forward traceback). Defaults to
            False.
        explosion_ratio (float): Growth of the gradient norm or the loss
            over the buffered iterations, or lr over what the param
            schedulers prescribe, that counts as an explosion. Defaults
            to 100 (two orders of magnitude).
        save_model (bool): Write the replayed weights to ``model.pth``.
            Defaults to True.
        diagnose_incidents (int, optional): The former name of
            ``max_diagnoses``; when given, it is used instead.

    Example:
        >>> custom_hooks = [dict(type='NanGuardHook', policy='skip'),
        ...                 dict(type='NanDiagnosisHook')]
    """

    priority = 'NORMAL'

    def __init__(
        self,
        max_diagnoses: int = 5,
        fp32_replay: bool = True,
        anomaly: bool = False,
        explosion_ratio: float = 100.0,
        save_model: bool = True,
        diagnose_incidents: Optional[int] = None,
    ) -> None:
        key = 'max_diagnoses'
        if diagnose_incidents is not None:
            key, max_diagnoses = 'diagnose_incidents', diagnose_incidents
        if (
            not isinstance(max_diagnoses, int)
            or isinstance(max_diagnoses, bool)
            or max_diagnoses < 0
        ):
            raise ValueError(
                f'NanDiagnosisHook: {key}={max_diagnoses!r} is invalid; '
                'expected an integer >= 0'
            )
        if not explosion_ratio > 1:
            raise ValueError(
                'NanDiagnosisHook: explosion_ratio='
                f'{explosion_ratio!r} is invalid; expected a '
                'number > 1'
            )
        self.max_diagnoses = max_diagnoses
        self.log = DiagnosisLog(max_diagnoses)
        self.fp32_replay = fp32_replay
        self.anomaly = anomaly
        self.explosion_ratio = float(explosion_ratio)
        self.save_model = save_model
        self.guard: Optional[NanGuardHook] = None

    def before_train(self, runner) -> None:
        """Subscribe to the :class:`NanGuardHook`'s incidents."""
        guards = [h for h in runner.hooks if isinstance(h, NanGuardHook)]
        if not guards:
            raise ValueError(
                'NanDiagnosisHook needs a NanGuardHook in the same runner: '
                "add dict(type='NanGuardHook') to custom_hooks"
            )
        self.guard = guards[0]
        self.guard.subscribe(self.on_incident)

    def on_incident(self, runner, event: IncidentEvent) -> None:
        """The listener: diagnose, write the files, log the verdict.

        Nothing here can stop training: a failure (a full disk included)
        is logged, recorded as ``diagnosis_error`` in the report, and
        training goes on under the guard's policy.
        """
        folder = event.folder
        if folder is None:  # nothing was recorded
            return
        try:
            self._respond(runner, event, folder)
        except Exception as err:  # noqa: BLE001  (logged and recorded)
            event.report['diagnosis_error'] = f'{type(err).__name__}: {err}'
            runner.logger.error(
                'nanguard: the diagnosis failed; training goes on under '
                f'the guard policy:\n{traceback.format_exc()}'
            )

    def _respond(self, runner, event: IncidentEvent, folder: str) -> None:
        report = event.report
        if report['kind'] == IncidentKind.NONFINITE_CHECKPOINT:
            runner.logger.info(
                'nanguard diagnosis: a poisoned checkpoint '
                'is not a training step; nothing to replay'
            )
            return
        unavailable = replay_unavailable(runner.model)
        if unavailable is not None:
            report['diagnosis_skipped'] = unavailable
            runner.logger.warning(f'nanguard diagnosis: {unavailable}')
            return
        # the incident that stops training is always diagnosed in full:
        # its report.md is what the user reads
        stopping = report['action'] == IncidentAction.RAISE
        earlier = self.log.repeat_of(report)
        recurs_after = None
        if earlier is not None and earlier['cause'] == Cause.TRANSIENT:
            recurs_after, earlier = earlier, None
        if earlier is not None and not stopping:
            report['repeat_of'] = earlier
            write_repeat_markdown(report, event.files_folder or folder)
            runner.logger.warning(
                f"nanguard diagnosis: the incident at iteration "
                f"{report['iteration']} repeats {earlier['folder']} "
                f"(cause {earlier['cause']}, stage {earlier['stage']}): "
                'same samples, kind and stage'
            )
            return
        if self.log.full and not stopping and recurs_after is None:
            report['diagnosis_skipped'] = (
                f'max_diagnoses={self.max_diagnoses} distinct incidents '
                'were diagnosed already'
            )
            return
        try:
            self._diagnose(runner, event, folder, recurs_after)
        finally:
            self.log.add(report, folder)

    def _diagnose(
        self,
        runner,
        event: IncidentEvent,
        folder: str,
        recurs_after: Optional[dict] = None,
    ) -> None:
        report, batch = event.report, event.batch
        amp_dtype, loss_scale = amp_settings(runner.optim_wrapper)
        optimizer_bad = (
            nonfinite_paths(runner.optim_wrapper.state_dict())
            if report['kind'] == IncidentKind.NONFINITE_PARAMS
            else []
        )
        files = event.files_folder or folder
        with replay_model(runner, report, event.snapshots) as (model, state):
            if self.save_model:
                state_dict = {
                    k: v.detach().cpu() for k, v in model.state_dict().items()
                }
                write_incident_file(
                    files, MODEL_NAME, lambda f: torch.save(state_dict, f)
                )
            found = diagnose(
                model,
                report,
                batch,
                replay_state=state,
                amp_dtype=amp_dtype,
                loss_scale=loss_scale,
                fp32_replay=self.fp32_replay,
                anomaly=self.anomaly,
                explosion_ratio=self.explosion_ratio,
                optimizer_nonfinite=optimizer_bad[:20],
                recurs_after=recurs_after,
            )
        found.apply_to(report)
        write_incident_file(files, CONFIG_NAME, runner.cfg.pretty_text)
        write_diagnosis_files(report, files)
        verdict = '\n  '.join(report['diagnosis']['verdict'])
        runner.logger.error(
            f'nanguard diagnosis:\n  {verdict}\n  '
            f"details: {osp.join(folder, 'report.md')}"
        )
