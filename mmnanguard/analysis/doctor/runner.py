# Copyright (c) mmnanguard contributors. All rights reserved.
"""Run every rule of the doctor on a config and print the findings."""

import os
from typing import Callable, Dict, List

from mmengine.config import Config

from .context import DoctorContext
from .finding import SEVERITIES, Finding
from .rules_box_loss import check_box_loss_inputs
from .rules_ctc import check_ctc_zero_infinity
from .rules_empty_gt import check_empty_gt
from .rules_labels import check_ignore_index
from .rules_modules import (
    check_batchnorm_eps,
    check_fragile_modules,
    check_loss_weights,
)
from .rules_optim import (
    check_amp_adam_eps,
    check_amp_fp32_island,
    check_amp_loss_scale,
    check_sgd_clip_grad,
)
from .rules_resume import check_resume_grad_scaler
from .rules_schedule import check_lr_scaling, check_warmup

#: Rule group -> its check, in the order they run.
RULES: Dict[str, Callable[[DoctorContext], List[Finding]]] = {
    'lr scaling': check_lr_scaling,
    'warmup': check_warmup,
    'clip_grad': check_sgd_clip_grad,
    'amp loss scale': check_amp_loss_scale,
    'amp adam eps': check_amp_adam_eps,
    'amp fp32 island': check_amp_fp32_island,
    'loss weights': check_loss_weights,
    'batchnorm eps': check_batchnorm_eps,
    'ignore_index': check_ignore_index,
    'fragile modules': check_fragile_modules,
    'box loss inputs': check_box_loss_inputs,
    'empty ground truth': check_empty_gt,
    'resume': check_resume_grad_scaler,
    'ctc zero_infinity': check_ctc_zero_infinity,
}


def run_doctor(
    cfg: Config, num_gpus: int = 1, label_samples: int = 4
) -> List[Finding]:
    """Every finding of every rule, most severe first.

    Args:
        cfg (Config): The loaded config.
        num_gpus (int): Number of processes training will run on.
            Defaults to 1.
        label_samples (int): Segmentation label maps to read.
            Defaults to 4.

    Returns:
        list[Finding]: The findings.
    """
    ctx = DoctorContext(cfg, num_gpus=num_gpus, label_samples=label_samples)
    findings = [f for rule in RULES.values() for f in rule(ctx)]
    return sorted(findings, key=lambda f: SEVERITIES.index(f.severity))


def format_findings(findings: List[Finding]) -> str:
    """The findings as a table: severity, rule, what, fix.

    Args:
        findings (list[Finding]): From :func:`run_doctor`.

    Returns:
        str: The table, or a line saying that nothing was found.
    """
    if not findings:
        return 'doctor: no finding'
    lines = [f'doctor: {len(findings)} finding(s)']
    for f in findings:
        where = f' ({f.path})' if f.path else ''
        lines.append(f'[{f.severity}] {f.rule}{where}: {f.message}')
        lines.append(f'    fix: {f.fix}')
    return '\n'.join(lines)


def doctor_summary(cfg: Config) -> str:
    """The doctor's table for ``tools/train.py --smoke-test``: the world
    size from ``WORLD_SIZE`` (set by ``torchrun``, else 1); a config the
    doctor cannot read is said in one line instead of raising.

    Args:
        cfg (Config): The training config.

    Returns:
        str: The table (or that one line).
    """
    from ..cli import INPUT_ERRORS

    try:
        num_gpus = max(int(os.environ.get('WORLD_SIZE', '1')), 1)
        return format_findings(run_doctor(cfg, num_gpus=num_gpus))
    except INPUT_ERRORS as err:
        return (
            f'doctor: could not check the config: {type(err).__name__}: {err}'
        )
