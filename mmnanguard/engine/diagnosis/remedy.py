# Copyright (c) mmnanguard contributors. All rights reserved.
"""What to do about each cause: a few concrete lines for ``report.md``."""

from typing import Any, Dict, List

from .replay import ReplayResult


def _data_remedy(finding: Dict[str, Any]) -> List[str]:
    where = (
        finding.get('annfile')
        or finding.get('img_path')
        or finding.get('seg_map_path')
        or f"sample {finding['sample']}"
    )
    if finding.get('line'):
        where = f"{where} line {finding['line']}"
    check = finding['check']
    lines = []
    if check == 'image_finite':
        lines.append(
            f'The image `{where}` holds non-finite pixels: '
            're-export or remove it.'
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
        'it drops such instances and logs each one.'
    )
    lines.append(
        'Scan the whole set once: `python tools/check_dataset.py ' 'CONFIG`.'
    )
    return lines


def _loss_remedy(replay: ReplayResult) -> List[str]:
    terms = [t for t in replay.nonfinite_terms if t != 'loss']
    module = (replay.loss_first or {}).get('type', '')
    lines = []
    if any('cls' in t for t in terms) or 'Focal' in module:
        lines.append(
            '`log(0)` in the classification loss: replace '
            "`FocalLoss` with `dict(type='StableFocalLoss')` "
            '(or `CrossEntropyLoss` with '
            "`dict(type='CheckedCrossEntropyLoss')`)."
        )
    if any('bbox' in t for t in terms):
        lines.append(
            'A box loss divided by a zero-size or degenerate box: use '
            "`dict(type='SafeDeltaXYWHTRBBoxCoder')` (rotated) and "
            "`ValidateAnnotations`; for GWD/KLD `dict(type='SafeGDLoss')`, "
            "for rotated IoU `dict(type='SafeRotatedIoULoss')`."
        )
    if any('dice' in t or 'seg' in t or 'decode' in t for t in terms):
        lines.append(
            "Segmentation loss: `dict(type='SafeDiceLoss')` or "
            "`dict(type='CheckedCrossEntropyLoss')`, and set "
            '`ignore_index`.'
        )
    return lines or [
        f"The loss term(s) {', '.join(terms)} are non-finite on finite "
        'inputs: look for log(0), x/0 or exp overflow in that loss.'
    ]


def remedies(diagnosis: Dict[str, Any], replay: ReplayResult) -> List[str]:
    """Remedy lines for a :func:`classify` result.

    Args:
        diagnosis (dict): ``cause``, ``evidence``, ``fp16_overflow``.
        replay (ReplayResult): The replay in the training precision.

    Returns:
        list[str]: Markdown lines, most specific first.
    """
    cause = diagnosis['cause']
    evidence = diagnosis['evidence']
    lines: List[str] = []
    if diagnosis.get('fp16_overflow'):
        lines.append(
            'fp16 overflow: train in bf16 (`AmpOptimWrapper` with '
            "`dtype='bfloat16'`), or keep the overflowing module in fp32."
        )
    if cause == 'data':
        lines += _data_remedy(evidence['data'][0])
    elif cause == 'forward':
        first = replay.forward_first
        weights = (evidence.get('module_weights') or [{}])[0]
        largest = (
            f" (largest |weight| {weights['max_abs']})"
            if weights.get('max_abs')
            else ''
        )
        lines.append(
            f"Module `{first['module']}` makes a non-finite output"
            + (
                f' from finite inputs: inspect its weights{largest} and '
                'initialisation, lower the learning rate, clip gradients.'
                if first['inputs_finite']
                else '.'
            )
        )
    elif cause == 'loss':
        lines += _loss_remedy(replay)
    elif cause == 'backward':
        lines.append(
            'A function with an infinite derivative at the value it got '
            '(`sqrt(0)`, `x ** 0.5`, `acos(1)`, `atan2(0, 0)`, the norm of '
            'a zero vector): add an epsilon inside it (`sqrt(x + eps)`) or '
            'use the safe loss.'
        )
        lines.append(
            '`python tools/replay.py INCIDENT_DIR --anomaly` names '
            'the failing op with its forward traceback.'
        )
    elif cause == 'explosion':
        growth = evidence['grad_norm_growth'] or {}
        lines.append(
            f"Lower the learning rate (it went {growth.get('lr_from')} -> "
            f"{growth.get('lr_to')}), warm up longer, clip gradients "
            "(`optim_wrapper.clip_grad=dict(max_norm=...)`)."
        )
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
    elif cause == 'transient':
        lines.append(
            'Nothing deterministic to fix in model or data: suspect '
            'nondeterministic kernels, races in custom ops, or the hardware '
            '(ECC errors). Keep `policy=skip`; if it recurs on one device, '
            'test that device.'
        )
    elif cause == 'optimizer':
        lines.append(
            'The optimizer state holds non-finite values: roll back '
            "(`NanGuardHook(policy='rollback')`) and check custom "
            'optimizer code.'
        )
    return lines
