# Copyright (c) mmnanguard contributors. All rights reserved.
"""``report.md``: the verdict of an incident for people.

Every string of the report passes :func:`clean_report` before it reaches
the Markdown: control characters, newlines and other line breaks become
spaces, so a value of a ``report.json`` (``action``, ``epoch``, a loss
term's name, ...) stays inside its line, whoever wrote the file.
"""

import os.path as osp
from typing import Any, Dict, List

from ..incident import ReportData, write_incident_file
from .ctc_alignment import describe_unaligned

REPORT_MD = 'report.md'


def clean_text(text: str) -> str:
    """``text`` with every non-printable character (control and format
    characters, newlines, line and paragraph separators) as a space."""
    if text.isprintable():
        return text
    return ''.join(c if c.isprintable() else ' ' for c in text)


def clean_report(value: Any, key: Any = None) -> Any:
    """A copy of ``value`` with every string (keys too) cleaned.

    The ``anomaly`` text (a traceback) becomes a list of cleaned lines,
    with no Markdown code fence in them.

    Args:
        value: A report or a part of it (JSON types).
        key: The key ``value`` is stored under.

    Returns:
        The cleaned copy.
    """
    if not isinstance(value, dict) and callable(
        getattr(value, 'to_dict', None)
    ):
        value = value.to_dict()  # an IncidentReport
    if isinstance(value, str):
        if key == 'anomaly':
            return [
                clean_text(line).replace('```', "'''")
                for line in value.splitlines()
            ]
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_report(k): clean_report(v, k) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_report(v) for v in value]
    return value


def _or(value: Any, missing: str) -> str:
    return missing if value is None else str(value)


def _sample_name(sample: Dict[str, Any]) -> str:
    """A sample's file name (with the field it came from, where that is
    not ``img_path``), else its image id."""
    path = sample.get('img_path') or sample.get('seg_map_path')
    if path:
        field = sample.get('path_field')
        return osp.basename(str(path)) + (f' ({field})' if field else '')
    if sample.get('img_id') is not None:
        return f"image id {sample['img_id']}"
    if sample.get('sample_idx') is not None:
        return f"dataset index {sample['sample_idx']} (no file named)"
    return 'a sample that names no file'


def stage_line(report: ReportData) -> str:
    """``'Stage: backward (live: ...); reproduced on replay: yes'``."""
    live = (report.get('live') or {}).get('text')
    reproduced = report.get('reproduced')
    answers: Dict[Any, str] = {True: 'yes', False: 'no'}
    again = answers.get(reproduced, 'not replayed')
    return (
        f"Stage: {report.get('stage')}"
        + (f' (live iteration: {live})' if live else '')
        + f'; reproduced on replay: {again}'
    )


def verdict_lines(report: ReportData) -> List[str]:
    """The four verdict lines: cause, stage, incident, first remedy.

    Args:
        report (dict): A report with ``diagnosis`` (see
            :func:`mmnanguard.engine.diagnosis.diagnose`).

    Returns:
        list[str]: Four lines of plain text.
    """
    report = clean_report(report)
    diag = report['diagnosis']
    cause = report['cause']
    terms = ', '.join(
        f'{k}={v}' for k, v in report.get('nonfinite_terms', {}).items()
    )
    incident = (
        f"{report['kind']} at iteration {report['iteration']} "
        f"(epoch {report.get('epoch')}, rank {report.get('rank')})"
        f"; non-finite loss terms: {terms or 'none'}; grad_norm="
        f"{_or(report.get('grad_norm'), 'not computed')}; action: "
        f"{report.get('action')}"
    )
    remedy = diag['remedy'][0] if diag['remedy'] else 'see the evidence'
    return [
        f"Cause: {cause} -- {diag['summary']}",
        stage_line(report),
        f'Incident: {incident}',
        f'Remedy: {remedy}',
    ]


def _num(value: Any) -> str:
    return f'{value:.3g}' if isinstance(value, float) else str(value)


def _replay_lines(title: str, replay: Dict[str, Any]) -> List[str]:
    lines = [
        f"- {title} ({replay['precision']}"
        + (
            f", loss x{replay['loss_scale']:g}"
            if replay.get('loss_scale')
            else ''
        )
        + f"): {'finite' if replay['finite'] else 'NON-FINITE'}"
    ]
    terms = ', '.join(
        f'{k}={v:.4g}' if isinstance(v, float) else f'{k}={v}'
        for k, v in replay['loss_terms'].items()
    )
    lines.append(f'  - loss terms: {terms or "(none)"}')
    for key, label in (
        ('forward_first', 'first non-finite activation'),
        ('loss_first', 'first non-finite loss module'),
    ):
        first = replay.get(key)
        if first:
            lines.append(
                f"  - {label}: `{first['module']}` ({first['type']}), "
                f"{first['path']}: {first['nan']} NaN, {first['posinf']} "
                f"+inf, {first['neginf']} -inf of {first['numel']}; inputs "
                f"{'finite' if first['inputs_finite'] else 'non-finite'}"
            )
    for entry in replay.get('ctc_unaligned') or []:
        lines.append(f'  - CTC cannot align {describe_unaligned(entry)}')
    if replay.get('ctc_error'):
        lines.append(
            '  - CTC alignment of the samples not checked: '
            f"{replay['ctc_error']}"
        )
    buffers = replay.get('nonfinite_buffers') or []
    if buffers:
        lines.append(
            '  - non-finite buffers after the forward: '
            + ', '.join(f'`{n}`' for n in buffers[:5])
            + (f' (and {len(buffers) - 5} more)' if len(buffers) > 5 else '')
        )
    jump = replay.get('magnitude_first')
    if jump:
        out_of_range = (
            'out of range' if jump['weights_out_of_range'] else ('in range')
        )
        lines.append(
            f"  - magnitudes first leave the normal range at "
            f"`{jump['module']}` ({jump['type']}): {jump['reason']}; its "
            f"weights max |w| {_num(jump['weight_max'])} ({out_of_range})"
        )
    if not replay['backward_ran']:
        lines.append('  - backward not run (non-finite loss)')
    first = replay.get('grad_first')
    if first:
        lines.append(
            f"  - first non-finite output gradient (backward "
            f"order): `{first['module']}` {first['output_path']}"
        )
    if replay.get('param_grads'):
        names = ', '.join(f"`{p['name']}`" for p in replay['param_grads'])
        lines.append(
            f'  - non-finite parameter gradients (backward order):' f' {names}'
        )
    bad = [k for k, ok in replay.get('term_grads', {}).items() if not ok]
    if bad:
        lines.append(
            f"  - loss terms with a non-finite gradient: " f"{', '.join(bad)}"
        )
    anomaly = replay.get('anomaly')
    if anomaly:
        if isinstance(anomaly, str):
            anomaly = clean_report(anomaly, 'anomaly')
        lines.append(
            '  - detect_anomaly:\n\n```\n' + '\n'.join(anomaly) + '\n```'
        )
    return lines


def render_markdown(report: ReportData) -> str:
    """The Markdown text of ``report.md`` (report values cleaned, see
    :func:`clean_report`)."""
    report = clean_report(report)
    diag = report['diagnosis']
    ev = report['evidence']
    out = [
        f"# NanGuard incident at iteration {report['iteration']}: "
        f"`{report['cause']}`",
        '',
    ]
    out += [
        f'{i}. {line}' for i, line in enumerate(verdict_lines(report), start=1)
    ]
    out += ['', '## Evidence', '']
    files = [_sample_name(s) for s in report.get('samples', [])]
    out.append(f"- batch: {', '.join(files) or '(unknown)'}")
    out.append(f"- replayed from: {diag['replay_state']}")
    if ev['data']:
        out.append('- data checks failed:')
        out += [f"  - {f['text']}" for f in ev['data']]
    else:
        out.append(
            '- data checks: no problem in the pixels, boxes, class labels '
            'and segmentation maps the batch holds'
        )
    out += _replay_lines('replay', ev['replay'])
    if ev.get('fp32_replay'):
        out += _replay_lines('fp32 replay', ev['fp32_replay'])
    growth = ev.get('grad_norm_growth')
    if growth:
        out.append(
            f"- gradient norm: {growth['from_norm']:.3g} (iteration "
            f"{growth['from_iter']}) -> {growth['to_norm']:.3g} "
            f"(iteration {growth['to_iter']}), x{growth['ratio']:.3g}"
            + (
                f"; lr {growth['lr_from']:.3g} -> {growth['lr_to']:.3g}"
                if growth.get('lr_from') and growth.get('lr_to')
                else ''
            )
        )
    loss = ev.get('loss_growth')
    if loss:
        out.append(
            f"- total loss: {loss['from_value']:.3g} (iteration "
            f"{loss['from_iter']}) -> {loss['to_value']:.3g} (iteration "
            f"{loss['to_iter']}), x{loss['ratio']:.3g}"
        )
    off = ev.get('lr_schedule')
    if off:
        out.append(
            f"- learning rate vs schedule: at most {off['ratio']:.3g}x "
            f"what the param schedulers prescribe (iteration "
            f"{off['iteration']}"
            + (
                f", param group {off['group']}"
                if off.get('group') is not None
                else ''
            )
            + f": {off['lr']:.3g} vs "
            f"{off['lr_scheduled']:.3g})"
        )
    for entry in ev.get('encoded_deltas') or []:
        coder = f" from `{entry['coder_type']}`" if entry['coder_type'] else ''
        out.append(
            f"- box loss fed encoded deltas: `{entry['head']}."
            f"{entry['loss_name']}` (`{entry['loss_type']}`, which takes "
            f'boxes) gets the deltas{coder}, as `{entry["head"]}` has '
            '`reg_decoded_bbox=False`'
        )
    for entry in ev.get('loss_modules', []):
        out.append(
            f"- loss term `{entry['term']}`: `{entry['type']}` at "
            f"`{entry['config_path']}`"
            + (f", drop-in `{entry['drop_in']}`" if entry['drop_in'] else '')
        )
    for module in ev.get('module_weights', []):
        out.append(
            f"- weights of `{module['module']}`: max |value| "
            f"{module['max_abs']}"
        )
    if ev.get('optimizer_state'):
        out.append(
            f"- non-finite optimizer state: "
            f"{', '.join(ev['optimizer_state'][:5])}"
        )
    out += ['', '## Remedy', '']
    out += [f'- {line}' for line in diag['remedy']]
    out += [
        '',
        '## Timeline',
        '',
        '![timeline](timeline.png)',
        '',
        'Files: `report.json` (everything above, machine-readable), '
        '`batch.pth` (the batch and RNG states); re-run offline with '
        '`python tools/replay.py INCIDENT_DIR --config CFG [--fp32] '
        '[--anomaly]`.',
        '',
    ]
    return '\n'.join(out)


def _write(text: str, folder: str) -> str:
    return write_incident_file(folder, REPORT_MD, text)


def write_markdown(report: ReportData, folder: str) -> str:
    """Write ``report.md`` into ``folder``; return its path."""
    return _write(render_markdown(report), folder)


def render_repeat(report: ReportData) -> str:
    """The Markdown of an incident that repeats an earlier diagnosis."""
    report = clean_report(report)
    earlier = report['repeat_of']
    return '\n'.join(
        [
            f"# NanGuard incident at iteration {report['iteration']}: "
            f"repeat of `{earlier['folder']}`",
            '',
            f"1. Repeats: {earlier['folder']} (iteration "
            f"{earlier['iteration']}): same samples, kind "
            f"({report['kind']}) and stage ({report.get('stage')})",
            f"2. Cause there: {earlier['cause']} -- {earlier['summary']}",
            f'3. {stage_line(report)}',
            '',
            f"See `../{earlier['folder']}/report.md`.",
            '',
        ]
    )


def write_repeat_markdown(report: ReportData, folder: str) -> str:
    """Write the ``report.md`` of a repeat into ``folder``; return its
    path."""
    return _write(render_repeat(report), folder)
