# Copyright (c) mmnanguard contributors. All rights reserved.
"""A seed per batch, set where the batch is loaded, in whichever process.

Bare mmengine draws the augmentations of a batch from the generators of the
process that loads it: the main process (``num_workers=0``: the stream
goes on from the run's seed) or a worker (seeded from the run's seed and
its worker id each time the loader's iterator is made). Which draws a
batch gets then depends on everything drawn before it in that process, so
a run resumed in the middle of an epoch cannot draw them again.

In a protected run each batch of indices is a :class:`SeededBatch`: a list
that carries ``seed = batch_seed(run seed, rank, n)`` for the run's n-th
batch, and sets python's, numpy's and torch's (CPU) generators from it when
the loader's fetcher iterates it, just before the first sample of the batch
is loaded (in the worker that loads it, or in the main process). The
augmentations of batch n are then the same whatever the number of workers,
whichever worker loads it, and whether the run was resumed.
"""

import random
from typing import Any, Iterable, Iterator, Tuple

import numpy as np
import torch


def batch_seed(run_seed: int, rank: int, number: int) -> int:
    """The seed of the run's ``number``-th batch on ``rank`` (< 2**32).

    Args:
        run_seed (int): The runner's seed.
        rank (int): The process's rank.
        number (int): The batch's number in the run, from 0.

    Returns:
        int: A seed for python, numpy and torch.
    """
    entropy = [run_seed % 2**32, rank, number]
    return int(np.random.SeedSequence(entropy).generate_state(1)[0])


def seed_generators(seed: int) -> None:
    """Set python's, numpy's and torch's CPU global generators from
    ``seed`` (not the GPUs': ``torch.manual_seed`` would take 0.17 ms a
    batch, and the checkpoint restores them)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.default_generator.manual_seed(seed)


class SeededBatch(list):
    """A batch of sample indices that seeds the generators of the process
    iterating it (the loader's fetcher, before it loads the first sample).

    Args:
        indices (iterable): The sample indices.
        seed (int): The batch's seed (:func:`batch_seed`).
    """

    def __init__(self, indices: Iterable[Any], seed: int) -> None:
        super().__init__(indices)
        self.seed = seed

    def __iter__(self) -> Iterator[Any]:
        seed_generators(self.seed)
        return super().__iter__()

    def __reduce__(self) -> Tuple[Any, ...]:
        return (SeededBatch, (list(super().__iter__()), self.seed))
