# Copyright (c) mmnanguard contributors. All rights reserved.
"""A resumed train loop continues at the next batch of the interrupted run,
without loading the batches it had trained.

mmengine 0.10.7 resumes an epoch-based loop at the first batch of the
interrupted epoch (a mid-epoch ``iter_k.pth`` trains the epoch's first
batches twice and ends past ``max_iters``), and an iteration-based loop by
loading and transforming every trained batch again (``next(iterator)``
``runner.iter`` times). Here the *batch sampler* is advanced instead: its
iterator yields lists of indices and loads nothing, so the cost is that of
drawing indices (the toolboxes' aspect-ratio samplers read each sample's
``width``/``height`` from the annotation list, no image). The loader then
continues that advanced iterator (:class:`SeededBatchSampler`, which also
numbers and seeds every batch: :mod:`.batch_seeds`), and
whatever iterates the loader, in this process or in workers, receives the
batch the interrupted run would have received next.

* :class:`ResumedIterator` replaces ``IterBasedTrainLoop.dataloader_
  iterator``: the loop's advance (``runner.iter`` calls of ``next``)
  costs nothing, and the first real ``next`` advances the batch sampler
  by ``runner.iter`` batches, passing the end of a finite sampler as
  mmengine's ``_InfiniteDataloaderIterator`` does (``set_epoch`` of the
  next pass). onedl-mmengine 0.10.12 advances with one ``skip_iter``
  call instead, which it takes as well.
* :func:`resumed_run_epoch` is ``EpochBasedTrainLoop.run_epoch`` for the
  interrupted epoch: the sampler advanced by the batches the checkpoint
  says were trained in it, and the batch index of each hook call counted
  from there.

Both call ``restore`` (the random generators of the checkpoint) after the
loader's iterator is made (which draws a seed) and before the first batch
is fetched (which draws the augmentations): the point at which the
interrupted run saved them.
"""

import logging
import time
from typing import Any, Callable, Iterator, List, Optional, Tuple

from mmengine.logging import print_log
from torch.utils.data import DataLoader

from mmnanguard.compat.dataloader_batch_sampler import replace_batch_sampler
from mmnanguard.compat.mmengine_private import end_loop_epoch

from .batch_seeds import SeededBatch, batch_seed


class SeededBatchSampler:
    """A built batch sampler whose batches are :class:`~.batch_seeds.
    SeededBatch` es, numbered across the run, and which can continue an
    iterator advanced beforehand (:meth:`continue_with`).

    A loader's iterator may call ``iter`` on its batch sampler more than
    once before it draws (torch's multi-process iterator does, in its
    ``__init__`` and again in ``_reset``): each call gets the advanced
    iterator until the first batch is drawn from it. Every attribute
    other than these is the sampler's.

    Args:
        inner: The loader's batch sampler.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._advanced: Optional[Iterator[List[int]]] = None
        self._run_seed = 0
        self._rank = 0
        self._drawn = 0

    def number_from(self, run_seed: int, rank: int, drawn: int) -> None:
        """Seed batches from ``run_seed`` and ``rank``; the next one drawn
        is the run's ``drawn``-th (its ``runner.iter``)."""
        self._run_seed, self._rank, self._drawn = run_seed, rank, drawn

    def continue_with(self, advanced: Optional[Iterator[List[int]]]) -> None:
        """Hand ``advanced`` to the next ``__iter__`` calls (None: start
        anew)."""
        self._advanced = advanced

    def __iter__(self) -> Iterator[List[int]]:
        return self._seeded(self._advanced)

    def _seeded(
        self, advanced: Optional[Iterator[List[int]]]
    ) -> Iterator[List[int]]:
        # runs at the first next(), not at iter()
        if advanced is not None:
            self._advanced = None
        for indices in advanced if advanced is not None else self.inner:
            seed = batch_seed(self._run_seed, self._rank, self._drawn)
            self._drawn += 1
            yield SeededBatch(indices, seed)

    def __len__(self) -> int:
        return len(self.inner)

    def __getattr__(self, name: str) -> Any:
        inner = self.__dict__.get('inner')
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)


def seeded_batch_sampler(loader: DataLoader) -> SeededBatchSampler:
    """The loader's :class:`SeededBatchSampler`, put in place once."""
    sampler: Any = loader.batch_sampler
    if not isinstance(sampler, SeededBatchSampler):
        sampler = SeededBatchSampler(sampler)
        replace_batch_sampler(loader, sampler)
    return sampler


def set_sampler_epoch(loader: DataLoader, epoch: int) -> None:
    """``set_epoch`` where mmengine's ``_InfiniteDataloaderIterator`` calls
    it at the end of a pass (the sampler's, else the batch sampler's)."""
    sampler: Any = getattr(loader, 'sampler', None)
    batch_sampler: Any = loader.batch_sampler
    if hasattr(sampler, 'set_epoch'):
        sampler.set_epoch(epoch)
    elif hasattr(getattr(batch_sampler, 'sampler', None), 'set_epoch'):
        batch_sampler.sampler.set_epoch(epoch)


def advance(
    batch_sampler: Any,
    batches: int,
    next_pass: Optional[Callable[[], None]] = None,
) -> Tuple[Optional[Iterator[List[int]]], int]:
    """Draw ``batches`` batches of indices from ``batch_sampler``.

    Args:
        batch_sampler: The sampler to advance (loads nothing).
        batches (int): How many to draw.
        next_pass (callable, optional): Called where a pass ends before
            ``batches`` were drawn, before the next pass starts; None: a
            pass that ends early ends the advance.

    Returns:
        tuple: The advanced iterator (None: the sampler ended early and
        ``next_pass`` is None) and the number of batches drawn.
    """
    iterator = iter(batch_sampler)
    drawn = 0
    while drawn < batches:
        try:
            next(iterator)
        except StopIteration:
            if next_pass is None:
                return None, drawn
            next_pass()
            iterator = iter(batch_sampler)
            continue
        drawn += 1
    return iterator, drawn


class ResumedIterator:
    """``IterBasedTrainLoop.dataloader_iterator`` of a protected run
    (``free=0`` for a run that starts at iteration 0: its loader's
    iterator is then made through the :class:`SeededBatchSampler`, which
    the one mmengine made when it built the loop is not).

    The first ``free`` calls of ``next`` (the loop's own advance) return
    None; the next one advances the batch sampler by ``free`` batches,
    makes the loader's iterator, calls ``restore`` and fetches. From then
    on it is mmengine's ``_InfiniteDataloaderIterator``: at the end of a
    pass, ``set_epoch`` of the next one and a new iterator.

    Args:
        loader (DataLoader): The loop's loader.
        free (int): The calls of ``next`` the loop makes to advance (its
            resumed iteration; 0 where it does not advance).
        restore (callable): Restores the checkpoint's random generators.
        trained (int, optional): The batches to advance the sampler by
            (the resumed iteration). Defaults to ``free``.
    """

    def __init__(
        self,
        loader: DataLoader,
        free: int,
        restore: Callable[[], None],
        trained: Optional[int] = None,
    ) -> None:
        self._loader = loader
        self._free = free
        self._trained = free if trained is None else trained
        self._restore: Optional[Callable[[], None]] = restore
        self._epoch = 0
        self._iterator: Optional[Iterator[Any]] = None

    def __iter__(self) -> 'ResumedIterator':
        return self

    def skip_iter(self, num_iters: int) -> None:
        """The loop's advance as onedl-mmengine 0.10.12 makes it (one call
        instead of ``num_iters`` calls of ``next``): costs nothing."""
        self._free = max(0, self._free - num_iters)

    def _next_pass(self) -> None:
        self._epoch += 1
        set_sampler_epoch(self._loader, self._epoch)

    def _position(self) -> Iterator[Any]:
        sampler = seeded_batch_sampler(self._loader)
        advanced, _ = advance(sampler.inner, self._trained, self._next_pass)
        sampler.continue_with(advanced)
        iterator = iter(self._loader)
        if self._restore is not None:
            self._restore()
            self._restore = None
        return iterator

    def __next__(self) -> Any:
        if self._free:
            self._free -= 1
            return None
        if self._iterator is None:
            self._iterator = self._position()
        try:
            return next(self._iterator)
        except StopIteration:
            print_log(
                'Reach the end of the dataloader, it will be restarted and '
                'continue to iterate. It is recommended to use '
                '`mmengine.dataset.InfiniteSampler` to enable the '
                'dataloader to iterate infinitely.',
                logger='current',
                level=logging.WARNING,
            )
            self._next_pass()
            time.sleep(2)  # as mmengine: workers between two passes
            self._iterator = iter(self._loader)
            return next(self._iterator)


def resumed_run_epoch(
    loop: Any, trained: int, restore: Callable[[], None]
) -> None:
    """``EpochBasedTrainLoop.run_epoch`` for the interrupted epoch.

    Args:
        loop (EpochBasedTrainLoop): The loop.
        trained (int): Batches of this epoch the checkpoint had trained.
        restore (callable): Restores the checkpoint's random generators.
    """
    runner = loop.runner
    runner.call_hook('before_train_epoch')
    runner.model.train()
    sampler = seeded_batch_sampler(loop.dataloader)
    advanced, drawn = advance(sampler.inner, trained)
    if advanced is None:
        runner.logger.warning(
            f'nanguard: the checkpoint trained {trained} batches of epoch '
            f'{loop.epoch + 1}, but its sampler yields {drawn}: the data '
            'is not that of the interrupted run; the epoch starts at its '
            'first batch, as mmengine resumes'
        )
        trained = 0
    sampler.continue_with(advanced)
    iterator = iter(loop.dataloader)
    restore()
    for idx, data_batch in enumerate(iterator, start=trained):
        loop.run_iter(idx, data_batch)
    runner.call_hook('after_train_epoch')
    end_loop_epoch(loop)
