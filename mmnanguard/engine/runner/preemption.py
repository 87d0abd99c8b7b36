# Copyright (c) mmnanguard contributors. All rights reserved.
"""Preemption: SIGTERM or SIGINT save a checkpoint and stop the run.

Schedulers (Slurm, Kubernetes, spot instances) send SIGTERM some seconds
before they kill a job; a user stops a run with Ctrl-C (SIGINT). Without
a handler Python dies at once and everything after the last periodic
checkpoint is lost. In a protected run (:class:`NanGuardRunner`,
``policy`` not ``'off'``):

1. ``NanGuardRunner.train`` installs :class:`PreemptionSignals` for
   SIGTERM and SIGINT (main thread only) and restores the previous
   handlers when training ends, however it ends. A signal only sets a
   flag; the running iteration finishes.
2. At the next iteration boundary :class:`PreemptionHook` (priority
   ``'LOWEST'``, after ``CheckpointHook``) sees the flag (in a distributed
   run, the ranks agree with one ``all_reduce`` of a 0/1 flag per
   iteration: any rank's signal counts), saves a checkpoint through
   ``runner.save_checkpoint`` (so every hook's ``before_save_checkpoint``
   runs, the file is durable and ``last_checkpoint`` names it), waits for
   every rank, logs what it did and raises :class:`TrainingPreempted`.
   When ``CheckpointHook`` saved at this very boundary, that checkpoint is
   the one named and nothing is saved twice.
3. ``tools/train.py`` exits with :data:`EXIT_PREEMPTED` (4) and one
   paragraph on stderr. ``tools/train.py CONFIG --resume`` (what a
   scheduler's requeue runs) continues from that checkpoint.

A second SIGTERM or SIGINT before the boundary acts as it would without
mmnanguard (the previous handler runs: SIGINT raises
``KeyboardInterrupt``, SIGTERM kills the process); the checkpoints
already written stay complete (they are written durably). A signal that
arrives after the last iteration changes nothing: the run ends as it
would have.

Which checkpoint
----------------
* ``IterBasedTrainLoop``: ``iter_<n>.pth`` after iteration ``n`` (the
  ``CheckpointHook`` file name and ``max_keep_ckpts`` rotation). A resume
  continues at iteration ``n + 1`` with the batch an uninterrupted run
  trains there (the sampler advanced past the ``n`` batches without
  loading them: :mod:`mmnanguard.engine.resume`).
* ``EpochBasedTrainLoop``, signal during the last iteration of an epoch:
  the boundary is the end of the epoch (after ``after_train_epoch``, so
  after an epoch checkpoint of ``CheckpointHook``); the checkpoint is
  ``epoch_<e>.pth`` with ``meta`` ``epoch=e`` and resuming starts epoch
  ``e + 1``: nothing is lost or repeated. Validation of that epoch is
  skipped.
* ``EpochBasedTrainLoop``, signal mid-epoch: ``iter_<n>.pth`` (outside the
  ``max_keep_ckpts`` rotation of an epoch-based ``CheckpointHook``) with
  ``meta`` ``epoch`` = the unfinished epoch and ``iter=n``. The resume
  continues that epoch at its next batch (:mod:`mmnanguard.engine.resume`;
  bare mmengine 0.10.7 starts the epoch again from its first batch).
"""

import logging
import os.path as osp
import signal
import threading
from types import FrameType
from typing import Any, Callable, Dict, Optional, Union

import torch
from mmengine.dist import all_reduce, barrier, get_world_size, is_main_process
from mmengine.hooks import Hook
from mmengine.runner import EpochBasedTrainLoop

from .durable_checkpoint_hook import (
    DurableCheckpointHook,
    find_checkpoint_hook,
    write_last_checkpoint,
)

#: tools/train.py's exit status after a preemption save.
EXIT_PREEMPTED = 4
#: The signals that request a preemption save.
PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGINT)

#: A signal's handler as ``signal.signal`` returns it: a function,
#: ``SIG_DFL`` or ``SIG_IGN`` (or their number), None for one not installed
#: from Python.
_Handler = Union[
    Callable[[int, Optional[FrameType]], Any], int, signal.Handlers, None
]


class TrainingPreempted(RuntimeError):
    """Training stopped on SIGTERM or SIGINT after saving a checkpoint.

    Args:
        message (str): What happened, naming the checkpoint.
        signal_name (str): ``'SIGTERM'`` or ``'SIGINT'``.
        checkpoint (str, optional): The checkpoint to resume from.
        iteration (int): The number of iterations done.
    """

    def __init__(
        self,
        message: str,
        signal_name: str,
        checkpoint: Optional[str],
        iteration: int,
    ) -> None:
        super().__init__(message)
        self.signal_name = signal_name
        self.checkpoint = checkpoint
        self.iteration = iteration


class PreemptionSignals:
    """SIGTERM/SIGINT handlers that only record the signal.

    Use :meth:`install` and :meth:`restore` around training (or the
    object as a context manager).
    """

    def __init__(self) -> None:
        #: The first signal received (its number), None before.
        self.received: Optional[int] = None
        self._previous: Dict[int, _Handler] = {}

    @property
    def signal_name(self) -> str:
        """The name of the received signal (``''`` before one)."""
        if self.received is None:
            return ''
        return signal.Signals(self.received).name

    def install(self) -> bool:
        """Install the handlers (only possible in the main thread).

        Returns:
            bool: Whether they were installed.
        """
        if threading.current_thread() is not threading.main_thread():
            return False
        self.received = None
        for signum in PREEMPTION_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        return True

    def restore(self) -> None:
        """Put the previous handlers back (nothing if none installed)."""
        previous, self._previous = self._previous, {}
        for signum, handler in previous.items():
            if handler is None:  # not installed from Python
                handler = signal.SIG_DFL
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.received is None:
            self.received = signum
            return
        # a second signal: what would have happened without us
        handler = self._previous.get(signum) or signal.SIG_DFL
        self.restore()
        if callable(handler):
            handler(signum, frame)
        elif handler != signal.SIG_IGN:
            signal.raise_signal(signum)

    def __enter__(self) -> 'PreemptionSignals':
        self.install()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.restore()


class PreemptionHook(Hook):
    """Save a checkpoint and raise :class:`TrainingPreempted` at the first
    iteration boundary after a preemption signal.

    Args:
        signals (PreemptionSignals): The flag that the handlers set.
    """

    priority = 'LOWEST'  # after CheckpointHook's save of the same boundary

    def __init__(self, signals: PreemptionSignals) -> None:
        self.signals = signals

    def after_train_iter(
        self,
        runner,
        batch_idx: int,
        data_batch: Any = None,
        outputs: Optional[dict] = None,
    ) -> None:
        """Act on a signal, unless this iteration ends an epoch of an
        epoch-based loop (then :meth:`after_train_epoch` does)."""
        loop = runner.train_loop
        if isinstance(loop, EpochBasedTrainLoop) and batch_idx + 1 == len(
            loop.dataloader
        ):
            return
        if self._agreed():
            self._stop(runner, epoch_end=False)

    def after_train_epoch(self, runner) -> None:
        """Act on a signal at the end of an epoch-based loop's epoch."""
        if isinstance(runner.train_loop, EpochBasedTrainLoop):
            if self._agreed():
                self._stop(runner, epoch_end=True)

    def before_train(self, runner) -> None:
        """Let the guard's step read carry the signal flag (under
        ``torch.distributed`` it joins the guard's one ``all_reduce``)."""
        self._guard = _step_guard(runner)
        if self._guard is not None:
            self._guard.votes[VOTE] = lambda: self.signals.received is not None

    def _agreed(self) -> bool:
        flag = self.signals.received is not None
        guard = getattr(self, '_guard', None)
        if guard is not None and VOTE in guard.votes:
            # the vote of this iteration's step, agreed by all ranks; an
            # iteration without a step (gradient accumulation) waits
            verdicts = guard.outcome.verdicts
            return any(v.votes.get(VOTE) for v in verdicts)
        if get_world_size() > 1:
            value = torch.tensor([1.0 if flag else 0.0])
            all_reduce(value, op='max')
            return bool(value.item() > 0)
        return flag

    def _stop(self, runner, epoch_end: bool) -> None:
        name = self.signals.signal_name or 'a signal on another rank'
        path = save_preemption_checkpoint(runner, epoch_end)
        barrier()
        # runner.iter counts the finished iterations only after
        # after_train_iter
        done = runner.iter if epoch_end else runner.iter + 1
        message = (
            f'nanguard: {name} received; saved {path!r} after iteration '
            f'{done} and stopped training. Continue with tools/train.py '
            'CONFIG --resume (exit status '
            f'{EXIT_PREEMPTED} from tools/train.py).'
        )
        runner.logger.log(logging.WARNING, message)
        raise TrainingPreempted(message, name, path, done)


#: The name of the signal flag among the step guard's votes.
VOTE = 'preemption'


def _step_guard(runner) -> Any:
    """The ``StepGuard`` of the runner's ``NanGuardHook``, or None."""
    for hook in runner.hooks:
        guard = getattr(hook, 'step_guard', None)
        if guard is not None and hasattr(guard, 'votes'):
            return guard
    return None


def save_preemption_checkpoint(runner, epoch_end: bool) -> str:
    """Save the state at the current boundary; return the checkpoint path.

    Args:
        runner (Runner): The runner, after ``after_train_iter`` (or
            ``after_train_epoch`` with ``epoch_end``).
        epoch_end (bool): The boundary is the end of an epoch of an
            epoch-based loop.

    Returns:
        str: The checkpoint that ``last_checkpoint`` now names.
    """
    hook = find_checkpoint_hook(runner)
    step = runner.epoch + 1 if epoch_end else runner.iter + 1
    if epoch_end:  # as CheckpointHook.after_train_epoch saves
        meta = dict(epoch=runner.epoch + 1, iter=runner.iter)
        filename = f'epoch_{step}.pth'
    else:
        meta = dict(epoch=runner.epoch, iter=runner.iter + 1)
        filename = f'iter_{step}.pth'
    if isinstance(hook, DurableCheckpointHook):
        return hook.save_at_boundary(runner, step, meta, by_epoch=epoch_end)
    # no CheckpointHook, or a user's subclass: save next to its files
    out_dir = getattr(hook, 'out_dir', None) or runner.work_dir
    backend = getattr(hook, 'file_backend', None)
    path = (
        backend.join_path(out_dir, filename)
        if backend is not None
        else osp.join(out_dir, filename)
    )
    runner.message_hub.update_info('last_ckpt', path)
    runner.save_checkpoint(out_dir, filename, meta=meta, by_epoch=epoch_end)
    if is_main_process():
        write_last_checkpoint(runner.work_dir, path)
    return path


def train_with_signals(
    runner: Any, base: Callable[[], Any], log: Callable[..., None]
) -> Any:
    """Run ``base`` (the base class's ``train``) with SIGTERM / SIGINT
    turned into a checkpoint at the next iteration boundary.

    Args:
        runner: The runner.
        base (callable): The base class's ``train``, bound.
        log (callable): ``log(msg, level)``, the protected runner's log.

    Returns:
        nn.Module: What ``base`` returns.
    """
    signals = getattr(runner, 'preemption_signals', None)
    if signals is None:
        return base()
    if not signals.install():
        log(
            'not in the main thread: SIGTERM and SIGINT stop training '
            'at once, without a checkpoint',
            logging.WARNING,
        )
    try:
        model = base()
    finally:
        signals.restore()
    if signals.received is not None:
        log(
            f'{signals.signal_name} received after the last iteration; '
            'training had finished',
            logging.WARNING,
        )
    return model


__all__ = [
    'EXIT_PREEMPTED',
    'PREEMPTION_SIGNALS',
    'PreemptionHook',
    'PreemptionSignals',
    'TrainingPreempted',
    'save_preemption_checkpoint',
    'train_with_signals',
]
