# Copyright (c) mmnanguard contributors. All rights reserved.
"""Rules on resuming: an AMP run resumed from a checkpoint that holds no
GradScaler state (the scale restarts at 65536 and overflows); a
``last_checkpoint`` that the resume refuses (not a regular file, too long,
not UTF-8, a NUL byte)."""

import os.path as osp
import pickle
from typing import List, Optional, Tuple

from mmnanguard.compat.checkpoint_allowlist import load_from_local
from mmnanguard.engine.runner.last_checkpoint_file import (
    last_checkpoint_problem,
)
from mmnanguard.fileio.checkpoint_verify import LAST_CHECKPOINT

from .context import DoctorContext
from .finding import Finding


def resume_checkpoint(ctx: DoctorContext) -> Tuple[Optional[str], str]:
    """The checkpoint a resumed run loads: ``load_from``, else the one
    named by ``{work_dir}/last_checkpoint`` (read by
    :func:`~mmnanguard.engine.runner.last_checkpoint_file.
    last_checkpoint_problem`: no link followed, at most 4096 bytes).

    Returns:
        tuple[str | None, str]: The path (None if not resuming or none is
        named) and, for a ``last_checkpoint`` that a resume refuses, what
        is wrong with it (``''``: nothing).
    """
    if not ctx.cfg.get('resume'):
        return None, ''
    if ctx.cfg.get('load_from'):
        return ctx.cfg.load_from, ''
    work_dir = ctx.cfg.get('work_dir')
    if not work_dir:
        return None, ''
    marker = osp.join(work_dir, LAST_CHECKPOINT)
    problem, named = last_checkpoint_problem(marker)
    if problem is not None:
        return None, f'{marker!r} {problem}'
    return named or None, ''


def check_resume_grad_scaler(ctx: DoctorContext) -> List[Finding]:
    """AMP resumed from a checkpoint without ``loss_scaler`` state. The
    checkpoint is read with ``weights_only=True`` and mmengine's allowlist
    (nothing in it runs). A ``last_checkpoint`` that the resume would
    refuse is an error-level finding naming it."""
    path, problem = resume_checkpoint(ctx)
    if problem:
        return [
            Finding(
                'unreadable-last-checkpoint',
                'error',
                f'resume=True reads {problem}: the resume stops (exit 2); '
                'expected one line of UTF-8 text naming a checkpoint',
                'remove the file to resume from the newest checkpoint, or '
                "load_from = '<checkpoint>'",
                'resume',
            )
        ]
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
