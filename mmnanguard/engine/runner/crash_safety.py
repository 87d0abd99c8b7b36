# Copyright (c) mmnanguard contributors. All rights reserved.
"""What ``NanGuardRunner`` does so that a crash, a full disk or a
preemption cannot ruin a protected run.

* every local checkpoint is written durably (:mod:`.durable_checkpoint`);
* ``CheckpointHook`` writes ``last_checkpoint`` durably and removes old
  checkpoints only after the new one is durable
  (:mod:`.durable_checkpoint_hook`);
* a resume takes the newest checkpoint that loads
  (:mod:`.resume_choice`, :mod:`.checkpoint_verify`), and a cut-short
  ``load_from`` file is refused with a message naming it;
* SIGTERM and SIGINT save a checkpoint at the next iteration boundary and
  stop with :class:`~.preemption.TrainingPreempted` (:mod:`.preemption`).

With ``nanguard.policy='off'`` none of this is done (the run is
mmengine's).
"""

import logging
import os
import stat
from typing import List, Optional

from mmengine.dist import broadcast_object_list, is_main_process
from mmengine.hooks import CheckpointHook
from mmengine.logging import print_log

from mmnanguard.fileio.checkpoint_verify import (
    is_local_path,
    truncation_problem,
)
from mmnanguard.fileio.durable_file import remove_temp_files
from mmnanguard.fileio.durable_folder import remove_temp_folders

from .checkpoint_fit import FitCheck
from .durable_checkpoint_hook import DurableCheckpointHook
from .preemption import PreemptionHook, PreemptionSignals
from .resume_choice import UnusableCheckpointError, choose_resume_checkpoint


def _log(msg: str, level: int = logging.INFO) -> None:
    print_log(msg, logger='current', level=level)


def install_crash_safety(runner) -> PreemptionSignals:
    """Make the runner's ``CheckpointHook`` durable and register the
    :class:`~.preemption.PreemptionHook`.

    Args:
        runner (Runner): The runner, with its default hooks registered.

    Returns:
        PreemptionSignals: The flag for ``train()`` to install.
    """
    for hook in runner.hooks:
        if isinstance(hook, CheckpointHook):
            if not DurableCheckpointHook.adopt(hook):
                _log(
                    f'nanguard: {type(hook).__name__} is a subclass of '
                    'CheckpointHook; its checkpoint files are written '
                    'durably, but its last_checkpoint and its removal of '
                    'old checkpoints stay as it does them',
                    logging.WARNING,
                )
    signals = PreemptionSignals()
    runner.register_hook(PreemptionHook(signals))
    return signals


def check_load_from(load_from: str) -> None:
    """Refuse a cut-short ``load_from`` file (not resuming), naming it.

    Args:
        load_from (str): The checkpoint or weights file to load.

    Raises:
        UnusableCheckpointError: It is empty, a truncated zip archive, or
            not a regular file (a FIFO blocks the read, ``/dev/zero``
            fills the memory).
    """
    if not is_local_path(load_from):
        return
    problem = truncation_problem(load_from)
    try:
        if not stat.S_ISREG(os.stat(load_from).st_mode):
            problem = 'it is not a regular file (a pipe, a device, a folder)'
    except (OSError, ValueError):
        pass  # a missing file: mmengine names it
    if problem is not None:
        raise UnusableCheckpointError(
            f'nanguard: cannot load load_from={load_from!r}: {problem}. '
            'Expected a complete torch.save file; copy it again or pass '
            'another one.'
        )


def resume_target(
    work_dir: str,
    load_from: Optional[str],
    fit: Optional[FitCheck] = None,
) -> Optional[str]:
    """The checkpoint a protected resume loads (the same on every rank).

    The main process removes the temporary files that a killed durable
    write left in ``work_dir``, picks the checkpoint
    (:func:`~.resume_choice.choose_resume_checkpoint`), logs every file
    it passed over, and tells the other ranks.

    Args:
        work_dir (str): The run's work dir.
        load_from (str, optional): The checkpoint named for resuming;
            None: the newest of ``work_dir``.
        fit (FitCheck, optional): ``size_problem(path)`` and
            ``fit(path)``, why a checkpoint does not fit the run
            (:mod:`.checkpoint_fit`); None: not checked.

    Returns:
        str | None: The checkpoint; None: start from scratch.

    Raises:
        UnusableCheckpointError: ``load_from`` does not load and no other
            checkpoint does, or checkpoints load but none fits, or
            ``last_checkpoint`` is hostile (a :class:`CheckpointValueError`
            on the main process; the same message on every rank).
    """
    # the path, or the error message
    chosen: List[Optional[str]] = [None, None]
    if is_main_process():
        for path in remove_temp_files(work_dir) + remove_temp_folders(
            work_dir
        ):
            _log(
                f'nanguard: removed {path!r}, left by a write that a kill '
                'interrupted'
            )
        try:
            choice = choose_resume_checkpoint(work_dir, load_from, fit)
        except UnusableCheckpointError as err:
            chosen = [None, str(err)]
        else:
            message = choice.message()
            if message:
                _log(message, logging.WARNING)
            if choice.path is not None:
                _log(f'nanguard: resuming from {choice.path!r}')
            elif not message:
                _log(
                    f'nanguard: no checkpoint in {work_dir!r} to resume '
                    'from; training starts from scratch'
                )
            chosen = [choice.path, None]
    broadcast_object_list(chosen)
    if chosen[1] is not None:
        raise UnusableCheckpointError(chosen[1])
    return chosen[0]


__all__ = ['check_load_from', 'install_crash_safety', 'resume_target']
