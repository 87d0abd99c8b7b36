# Copyright (c) mmnanguard contributors. All rights reserved.
"""Rule on resuming: an AMP run resumed from a checkpoint that holds no
GradScaler state (the scale restarts at 65536 and overflows)."""

import os.path as osp
import pickle
from typing import List, Optional

from mmnanguard.compat.checkpoint_allowlist import load_from_local

from .context import DoctorContext
from .finding import Finding


def resume_checkpoint(ctx: DoctorContext) -> Optional[str]:
    """The checkpoint a resumed run loads: ``load_from``, else the one
    named by ``{work_dir}/last_checkpoint``; None if not resuming."""
    if not ctx.cfg.get('resume'):
        return None
    if ctx.cfg.get('load_from'):
        return ctx.cfg.load_from
    work_dir = ctx.cfg.get('work_dir')
    marker = osp.join(work_dir, 'last_checkpoint') if work_dir else ''
    if marker and osp.isfile(marker):
        with open(marker) as f:
            return f.read().strip()
    return None


def check_resume_grad_scaler(ctx: DoctorContext) -> List[Finding]:
    """AMP resumed from a checkpoint without ``loss_scaler`` state. The
    checkpoint is read with ``weights_only=True`` and mmengine's allowlist
    (nothing in it runs)."""
    path = resume_checkpoint(ctx)
    if path is None or not ctx.is_amp:
        return []
    fix = 'optim_wrapper = dict(loss_scale=dict(init_scale=1024.0))'
    try:
        ckpt = load_from_local(path, map_location='cpu')
    except (OSError, RuntimeError, ValueError, pickle.UnpicklingError) as err:
        return [
            Finding(
                'resume-without-grad-scaler',
                'info',
                f'cannot read the resume checkpoint {path!r} to check its '
                f'GradScaler state: {type(err).__name__}: {err}',
                fix,
                'load_from',
            )
        ]
    optim = ckpt.get('optimizer') if isinstance(ckpt, dict) else None
    if isinstance(optim, dict) and 'loss_scaler' in optim:
        return []
    return [
        Finding(
            'resume-without-grad-scaler',
            'warning',
            f'AMP resumes from {osp.basename(path)}, which holds no '
            'GradScaler state (saved without AMP): the scale restarts at '
            '65536 and the first steps overflow',
            fix,
            'load_from',
        )
    ]
