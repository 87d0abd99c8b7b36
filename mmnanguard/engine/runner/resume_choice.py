# Copyright (c) mmnanguard contributors. All rights reserved.
"""Which checkpoint a protected run resumes from.

mmengine 0.10.7 resumes from what ``<work_dir>/last_checkpoint`` names
(``resume=True``) or from ``load_from`` (``resume=True`` with a path,
``tools/train.py --resume CKPT``), without looking at the file first: an
empty ``last_checkpoint`` ends in ``FileNotFoundError:  can not be
found.``, a truncated checkpoint in a zip-reader ``RuntimeError``, and a
missing ``last_checkpoint`` starts the run from scratch although complete
checkpoints are there. :func:`choose_resume_checkpoint` instead takes

* with ``resume=True`` and no path: the newest checkpoint of the work dir
  that loads (:func:`~.checkpoint_verify.verified_checkpoints`, then one
  secure load of the one picked). That is the one ``last_checkpoint``
  names, or a newer complete one (a kill between writing a checkpoint and
  renaming ``last_checkpoint`` into place), or, when the named one does
  not load, the newest older one. With no usable checkpoint the run
  starts from scratch, as mmengine's does without ``last_checkpoint``;
* with a path: that file when it loads; otherwise the newest checkpoint
  that loads in its folder and in the work dir; with none,
  :class:`UnusableCheckpointError` (the file was asked for by name).

"Loads" includes "fits": given a ``fit`` check (the protected runners
give :func:`~.checkpoint_fit.fit_check`), a file that loads but is not
the state of this model and optimizer is passed over like a truncated
one; when files load but none fits, :class:`UnusableCheckpointError`
(starting from scratch would overwrite them). ``last_checkpoint`` is
read by :func:`~.last_checkpoint_file.read_checked_last_checkpoint`: a
hostile one stops the resume with :class:`CheckpointValueError`.

Every choice other than the plain one is logged as a WARNING naming the
file passed over and why. Cost: the cheap check of every candidate
(milliseconds each, see :mod:`.checkpoint_verify`) and one secure load
of the checkpoint picked (two with a ``fit`` check), before mmengine
loads it again to resume (for the tiny config's 96 MB checkpoint: 0.4 s
a load, once per run).
"""

import os.path as osp
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from mmnanguard.fileio.checkpoint_verify import (
    candidate_checkpoints,
    checkpoint_problem,
)

from .checkpoint_fit import NOT_FITTING, FitCheck
from .last_checkpoint_file import read_checked_last_checkpoint
from .resume_errors import CheckpointValueError, UnusableCheckpointError


@dataclass
class ResumeChoice:
    """The outcome of :func:`choose_resume_checkpoint`.

    Args:
        path (str, optional): The checkpoint to resume from; None: start
            from scratch.
        asked (str, optional): What ``last_checkpoint`` or the caller
            named (``''``: an empty ``last_checkpoint``; None: nothing).
        passed_over (list[tuple[str, str]]): Newer files not taken, with
            the reason.
        explicit (bool): ``asked`` was named by the caller (``--resume
            CKPT``), not by ``last_checkpoint``.
    """

    path: Optional[str]
    asked: Optional[str]
    passed_over: List[Tuple[str, str]] = field(default_factory=list)
    explicit: bool = False

    def message(self) -> Optional[str]:
        """The WARNING to log; None when the asked-for file was taken and
        nothing newer was passed over."""
        if self.path is not None and self.path == self.asked:
            if not self.passed_over:
                return None
        if self.explicit:
            asked = f'--resume named {self.asked!r}'
        elif self.asked is None:
            asked = 'the work dir has no last_checkpoint'
        elif self.asked == '':
            asked = 'last_checkpoint is empty'
        else:
            asked = f'last_checkpoint names {self.asked!r}'
        if self.path is None:
            target = 'no checkpoint loads, training starts from scratch'
        else:
            target = (
                f'resuming from {self.path!r}, the newest checkpoint that '
                'loads'
            )
        skipped = '; '.join(f'{p!r}: {why}' for p, why in self.passed_over)
        passed = f' (passed over: {skipped})' if skipped else ''
        return f'nanguard: {asked}; {target}{passed}'


def _same_file(a: Optional[str], b: Optional[str]) -> bool:
    if not a or not b:
        return False
    return osp.realpath(a) == osp.realpath(b)


def _usable_problem(path: str, fit: Optional[FitCheck]) -> Optional[str]:
    problem = None if fit is None else fit.size_problem(path)
    if problem is None:
        problem = checkpoint_problem(path, load=True)
    if problem is None and fit is not None:
        problem = fit(path)
    return problem


def _first_loadable(
    candidates: List[str],
    passed_over: List[Tuple[str, str]],
    fit: Optional[FitCheck] = None,
) -> Optional[str]:
    for path in candidates:
        problem = _usable_problem(path, fit)
        if problem is None:
            return path
        passed_over.append((path, problem))
    return None


def _none_fits(work_dir: str, passed_over: List[Tuple[str, str]]) -> None:
    unfit = [(p, why) for p, why in passed_over if why.startswith(NOT_FITTING)]
    if unfit:
        path, why = unfit[0]
        raise UnusableCheckpointError(
            f'nanguard: no checkpoint in {work_dir!r} fits this run: '
            f'{path!r}: {why}. Expected a checkpoint of this config; '
            'resume with the config that wrote it, or start again in '
            'another work dir (training from scratch here would overwrite '
            'its checkpoints).'
        )


def choose_resume_checkpoint(
    work_dir: str,
    load_from: Optional[str] = None,
    fit: Optional[FitCheck] = None,
) -> ResumeChoice:
    """Pick the checkpoint to resume from (see the module docstring).

    Args:
        work_dir (str): The run's work dir.
        load_from (str, optional): The checkpoint asked for by name
            (``Runner(load_from=..., resume=True)``); None: the work dir's
            latest.
        fit (FitCheck, optional): Why a checkpoint declares more than
            this model's checkpoint holds (asked before it is loaded), or
            loads but does not fit the run (:class:`~.checkpoint_fit.
            FitCheck`); such a file is passed over like a truncated one.
            None: not checked.

    Returns:
        ResumeChoice: The file (None: start from scratch) and what was
        passed over.

    Raises:
        UnusableCheckpointError: ``load_from`` does not load and no other
            checkpoint next to it or in the work dir does; or checkpoints
            load but none fits.
        CheckpointValueError: ``<work_dir>/last_checkpoint`` is not a
            regular file of UTF-8 text without NUL bytes
            (:mod:`.last_checkpoint_file`).
    """
    passed_over: List[Tuple[str, str]] = []
    if load_from is not None:
        problem = _usable_problem(load_from, fit)
        if problem is None:
            return ResumeChoice(load_from, load_from, explicit=True)
        passed_over.append((load_from, problem))
        read_checked_last_checkpoint(work_dir)
        folders = [osp.dirname(load_from) or '.', work_dir]
        candidates = []
        for folder in folders:
            candidates += [
                p
                for p in candidate_checkpoints(folder)
                if not _same_file(p, load_from) and p not in candidates
            ]
        path = _first_loadable(candidates, passed_over, fit)
        if path is None:
            raise UnusableCheckpointError(
                f'nanguard: cannot resume from {load_from!r}: {problem}; '
                f'no other checkpoint in {sorted(set(folders))} loads '
                f'either. Expected an mmengine checkpoint written to the '
                'end; pass another one with --resume CKPT, or start the '
                'run again without --resume.'
            )
        return ResumeChoice(path, load_from, passed_over, explicit=True)
    exists, named = read_checked_last_checkpoint(work_dir)
    asked = named if exists else None
    candidates = candidate_checkpoints(work_dir)
    # a newer complete checkpoint than the named one comes first
    path = _first_loadable(candidates, passed_over, fit)
    if path is None:
        _none_fits(work_dir, passed_over)
    if _same_file(path, asked):
        return ResumeChoice(asked, asked, passed_over)
    if asked and not any(_same_file(p, asked) for p, _ in passed_over):
        problem = checkpoint_problem(asked)
        passed_over.append(
            (asked, problem or 'a newer complete checkpoint exists')
        )
    return ResumeChoice(path, asked, passed_over)


__all__ = [
    'CheckpointValueError',
    'ResumeChoice',
    'UnusableCheckpointError',
    'choose_resume_checkpoint',
]
