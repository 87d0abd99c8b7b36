# Copyright (c) mmnanguard contributors. All rights reserved.
"""What to do about each cause: a few concrete lines for ``report.md``."""

from typing import Any, Dict, List, Optional

from mmnanguard.datasets.checks import IMAGE_CHECKS

from ..incident import Cause, Stage
from .ctc_alignment import describe_unaligned
from .drop_ins import SAFE_MODULES_INCLUDE
from .finding_words import record_place
from .replay import ReplayResult


def _data_remedy(finding: Dict[str, Any]) -> List[str]:
    where = record_place(finding)
    check = finding['check']
    lines = []
    if check == 'image_finite':
        lines.append(
            f'The image `{where}` holds non-finite pixels: '
            're-export or remove it.'
        )
    elif check == 'image_range':
        count, value = (finding.get('values') or [None, None])[:2]
        shown = f'{value:.4g}' if isinstance(value, float) else value
        lines.append(
            f'The image `{where}` holds {count} pixels of value up to '
            f'{shown}: a NoData value (GDAL float32: -3.4e38)? Mask them '
            '(set them to 0 or the mean, e.g. with `nodata` when '
            'exporting tiles), or remove the image.'
        )
    elif finding.get('clipped_at'):
        raw = finding.get('raw')
        form = finding.get('raw_form')
        annotated = (
            f' (annotated as {tuple(raw)}' + (f', {form})' if form else ')')
            if raw
            else ''
        )
        lines.append(
            f'The box in `{where}`{annotated} lies outside its image: the '
            "pipeline clips it to zero size at the image's "
            f"{finding['clipped_at']} border. Fix its coordinates or "
            'delete it.'
        )
        declared = finding.get('declared_shape')
        if declared:
            real = finding['ori_shape']
            lines.append(
                f'The annotation file declares this image as '
                f'{declared[1]}x{declared[0]} (width x height) but the '
                f'image file is {real[1]}x{real[0]}: fix the `width` and '
                '`height` of its `images` entry (the box was kept by the '
                'declared size).'
            )
    elif check.endswith('_size') or check == 'qbox_area':
        lines.append(f'Fix or delete the zero-size box in `{where}`.')
    elif check.endswith('_finite'):
        lines.append(f'Fix the non-finite box coordinate in `{where}`.')
    elif check == 'label_range':
        lines.append(
            f'Fix the label out of range in `{where}` (or the '
            "model's `num_classes`)."
        )
    elif check == 'seg_values':
        lines.append(
            f'Map the stray values of `{where}` to classes or to '
            'ignore_index (or set the loss `ignore_index`).'
        )
    lines.append(
        "Add `dict(type='ValidateAnnotations', num_classes=..., "
        "policy='filter')` after the augmentations, before `Pack*Inputs`: "
        + (
            'it drops such samples (the dataset fetches another) and logs '
            'each one.'
            if check in IMAGE_CHECKS
            else 'it drops such instances and logs each one.'
        )
    )
    lines.append(
        'Scan the whole set once: `python tools/check_dataset.py ' 'CONFIG`.'
    )
    return lines


def _fmt_number(value: Any) -> Optional[str]:
    try:
        return f'{float(value):.3g}'
    except (TypeError, ValueError):
        return None


def _drop_in_lines(entries: List[Dict[str, Any]]) -> List[str]:
    """One line per loss module (or coder) that went non-finite."""
    lines = []
    for entry in entries:
        term = f" (loss term `{entry['term']}`)" if entry.get('term') else ''
        where = f"`{entry['type']}` at `{entry['config_path']}`{term}"
        ctc = entry.get('ctc')
        if ctc is not None and not ctc['zero_infinity']:
            lines.append(
                f'{where} is a CTC loss with zero_infinity=False '
                f"(`{ctc['module']}`): a text label that cannot be aligned "
                'to the output sequence (longer than it, or with repeated '
                'characters that need a blank frame between them) has an '
                f"infinite loss. Set `{ctc['config_path']}.zero_infinity="
                'True`, or drop such labels (`python tools/doctor.py '
                'CONFIG` reports the setting: ctc-zero-infinity).'
            )
        elif entry.get('drop_in'):
            lines.append(
                f"Replace {where} with mmnanguard's drop-in "
                f"`dict(type='{entry['drop_in']}', ...)` (every argument "
                'kept), or add '
                f"`'{SAFE_MODULES_INCLUDE}'` to `_base_`: it swaps every "
                'module that has a drop-in.'
            )
        else:
            lines.append(
                f'{where} has no mmnanguard drop-in: look for `log(0)`, '
                '`x / 0`, `sqrt(0)` or an `exp` overflow in it.'
            )
    return lines


def _mismatched_heads(evidence: Dict[str, Any]) -> List[str]:
    """The heads that feed encoded deltas to their box loss."""
    return [m['head'] for m in evidence.get('encoded_deltas') or []]


def _in_heads(module: str, heads: List[str]) -> bool:
    return any(module == h or module.startswith(f'{h}.') for h in heads)


def _culprits(evidence: Dict[str, Any], terms: List[str]) -> List[Dict]:
    """The loss modules of ``terms``, and the box coder of a box term;
    none of a head that feeds encoded deltas to its box loss (no drop-in
    helps there: the fix is ``reg_decoded_bbox=True``)."""
    entries = [
        e for e in evidence.get('loss_modules', []) if e['term'] in terms
    ]
    if any('bbox' in t for t in terms):
        entries += [e for e in evidence.get('box_coders', []) if e['drop_in']]
    heads = _mismatched_heads(evidence)
    return [e for e in entries if not _in_heads(e['module'], heads)]


def _loss_remedy(evidence: Dict[str, Any], replay: ReplayResult) -> List[str]:
    terms = [t for t in replay.nonfinite_terms if t != 'loss']
    entries = _culprits(evidence, terms)
    first = evidence.get('loss_first_module')
    heads = _mismatched_heads(evidence)
    if not entries and first and not _in_heads(first['module'], heads):
        entries = [first]
    lines = _drop_in_lines(entries)
    if heads:
        return lines
    if any('seg' in t or 'decode' in t or '_ce' in t for t in terms):
        lines.append(
            'Set the loss `ignore_index` to the label of void pixels.'
        )
    return lines or [
        f"The loss term(s) {', '.join(terms)} are non-finite on finite "
        'inputs: look for log(0), x/0 or exp overflow in that loss.'
    ]


def _backward_remedy(
    evidence: Dict[str, Any], replay: ReplayResult
) -> List[str]:
    terms = [k for k, ok in replay.term_grads.items() if not ok]
    lines = _drop_in_lines(_culprits(evidence, terms))
    if replay.param_grads:
        lines.append(
            'The first parameter to receive a non-finite gradient '
            f"(backward order) is `{replay.param_grads[0]['name']}`."
        )
    lines.append(
        'A function with an infinite derivative at the value it got '
        '(`sqrt(0)`, `x ** 0.5`, `acos(1)`, `atan2(0, 0)`, the norm of '
        'a zero vector): add an epsilon inside it (`sqrt(x + eps)`) or '
        'use the safe loss.'
    )
    lines.append(
        '`python tools/replay.py INCIDENT_DIR --config CFG --anomaly` names '
        'the failing op with its forward traceback.'
    )
    return lines


def _lr_words(evidence: Dict[str, Any]) -> str:
    """``'(it was 2.5 where the schedule says 0.0025)'`` or similar, from
    whatever the evidence holds; never a None."""
    off = evidence.get('lr_schedule') or {}
    growth = evidence.get('grad_norm_growth') or {}
    lr, planned = (
        _fmt_number(off.get('lr')),
        _fmt_number(off.get('lr_scheduled')),
    )
    if lr and planned and off.get('ratio', 1.0) >= 2.0:
        return f' (it was {lr} where the schedule prescribes {planned})'
    start, end = (
        _fmt_number(growth.get('lr_from')),
        _fmt_number(growth.get('lr_to')),
    )
    if start and end:
        return f' (it went {start} -> {end})'
    current = _fmt_number(evidence.get('lr'))
    return f' (it is {current})' if current else ''


def _explosion_remedy(
    evidence: Dict[str, Any], replay: ReplayResult
) -> List[str]:
    lines = [
        f'Lower the learning rate{_lr_words(evidence)}, warm up longer, '
        'clip gradients (`optim_wrapper.clip_grad=dict(max_norm=...)`).'
    ]
    if replay.top_grads and isinstance(replay.grad_norm, str):
        lines.append(
            f"Look at the weights of `{replay.top_grads[0]['name']}` "
            '(largest gradient): a weight blow-up there makes the '
            'gradients overflow.'
        )
    lines.append(
        "`NanGuardHook(policy='rollback', lr_backoff=0.5)` "
        'restores the last good state and halves the lr.'
    )
    return lines


def _forward_remedy(
    evidence: Dict[str, Any], replay: ReplayResult
) -> List[str]:
    overflow = replay.magnitude_first
    if overflow and overflow.get('weights_out_of_range'):
        weight = _fmt_number(overflow['weight_max'])
        return [
            f"The weights of `{overflow['module']}` ({overflow['type']}) "
            f'are out of range (max |w| {weight}) '
            f"and make its output overflow ({overflow['reason']}): find "
            'what wrote them (an optimizer step with a huge lr or a '
            'poisoned state, a bad checkpoint, custom code); '
            "`NanGuardHook(policy='rollback')` restores the last good "
            'weights.'
        ]
    first = replay.forward_first
    if first is None:  # cause 'forward' is an overflow (above) or this
        return []
    weights = (evidence.get('module_weights') or [{}])[0]
    largest = (
        f" (largest |weight| {weights['max_abs']})"
        if weights.get('max_abs')
        else ''
    )
    return [
        f"Module `{first['module']}` makes a non-finite output"
        + (
            f' from finite inputs: inspect its weights{largest} and '
            'initialisation, lower the learning rate, clip gradients.'
            if first['inputs_finite']
            else '.'
        )
    ]


def _transient_remedy(stage: str) -> List[str]:
    lines = []
    if stage == Stage.DATA:
        lines.append(
            'The inputs held a non-finite value in the live iteration '
            'only: suspect the data loading (a corrupt or truncated read, '
            'a race in a worker, a random transform), not the stored file.'
        )
    lines.append(
        'Nothing deterministic to fix in model or data: suspect '
        'nondeterministic kernels, races in custom ops, or the hardware '
        '(ECC errors). Keep `policy=skip`; if it recurs on one device, '
        'test that device.'
    )
    return lines


def remedies(diagnosis: Dict[str, Any], replay: ReplayResult) -> List[str]:
    """Remedy lines for a :func:`classify` result.

    Args:
        diagnosis (dict): ``cause``, ``stage``, ``evidence`` (with
            ``loss_modules``, ``box_coders``, ``loss_first_module`` and
            ``lr`` from :func:`~.diagnose.diagnose`), ``fp16_overflow``.
        replay (ReplayResult): The replay in the training precision.

    Returns:
        list[str]: Markdown lines, most specific first.
    """
    cause = diagnosis['cause']
    evidence = diagnosis['evidence']
    lines: List[str] = []
    if cause != Cause.DATA:
        # the real fix of a box loss fed encoded deltas comes first
        lines += [
            m['fix'].replace('nanguard: ', '', 1)
            for m in evidence.get('encoded_deltas') or []
        ]
    if diagnosis.get('fp16_overflow'):
        lines.append(
            'fp16 overflow: train in bf16 (`AmpOptimWrapper` with '
            "`dtype='bfloat16'`), or keep the overflowing module in fp32."
        )
    if cause == Cause.DATA:
        lines += _data_remedy(evidence['data'][0])
    elif cause == Cause.FORWARD:
        lines += _forward_remedy(evidence, replay)
    elif cause == Cause.LOSS:
        lines += _loss_remedy(evidence, replay)
    elif cause == Cause.BACKWARD:
        lines += _backward_remedy(evidence, replay)
    elif cause == Cause.EXPLOSION:
        lines += _explosion_remedy(evidence, replay)
    elif cause == Cause.TRANSIENT:
        lines += _transient_remedy(diagnosis.get('stage', ''))
    elif cause == Cause.RECURRING:
        lines += [
            'The same samples give this incident again: inspect them '
            '(`python tools/check_dataset.py CONFIG --augment-repeats 8` '
            'runs the augmentations too), fix or remove them, or drop them '
            "with `dict(type='ValidateAnnotations', policy='filter')`.",
            'Replay the first incident offline with `--anomaly`: `python '
            'tools/replay.py INCIDENT_DIR --config CFG --anomaly`.',
        ]
    elif cause == Cause.OPTIMIZER:
        lines.append(
            'The optimizer state holds non-finite values: roll back '
            "(`NanGuardHook(policy='rollback')`) and check custom "
            'optimizer code.'
        )
    if replay.ctc_unaligned:
        lines.append(_ctc_samples_remedy(replay.ctc_unaligned))
    return lines


def _ctc_samples_remedy(found: List[Dict[str, Any]]) -> str:
    """Name the samples a CTC loss cannot align (the replay found them)."""
    samples = '; '.join(describe_unaligned(e) for e in found)
    return (
        f'CTC cannot align {len(found)} sample(s) of this batch: {samples}. '
        'Drop or shorten such labels (a dataset filter on the label '
        'length), or give the recognizer a longer output; with '
        '`zero_infinity=True` they add zero loss instead of inf.'
    )
