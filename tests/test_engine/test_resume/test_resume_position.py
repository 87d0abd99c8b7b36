# Copyright (c) mmnanguard contributors. All rights reserved.
"""The loader of a resumed run continues at the next batch of the
uninterrupted one, without loading a trained sample, with mmengine's
samplers and mmdet's aspect-ratio batch sampler, in this process and in
workers; each batch draws its augmentations from its own seed."""

import numpy as np
import pytest
import torch
from mmdet.datasets.samplers import AspectRatioBatchSampler
from mmengine.dataset import DefaultSampler, InfiniteSampler
from mmengine.runner import loops as mmengine_loops
from torch.utils.data import BatchSampler, DataLoader, Dataset

from mmnanguard.engine.resume import resume_position
from mmnanguard.engine.resume.batch_seeds import SeededBatch, batch_seed
from mmnanguard.engine.resume.resume_position import (
    ResumedIterator,
    advance,
    seeded_batch_sampler,
)


class CountingDataset(Dataset):
    """Sample i: (i, a draw of numpy's generator); counts the loads in this
    process. ``get_data_info`` gives portrait and landscape sizes."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.loads = 0

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int):
        self.loads += 1
        return torch.tensor([float(index), np.random.rand()])

    def get_data_info(self, index: int):
        return dict(width=10, height=20 if index % 3 else 5)


def _loader(dataset, sampler, workers=0, batch_sampler=None):
    if batch_sampler is None:
        batch_sampler = BatchSampler(sampler, 2, drop_last=False)
    return DataLoader(
        dataset,
        batch_sampler=batch_sampler,
        num_workers=workers,
        persistent_workers=workers > 0,
    )


def _epochs(loader, epochs):
    """The uninterrupted run: every batch of ``epochs`` epochs."""
    batches = []
    for epoch in range(epochs):
        loader.batch_sampler.sampler.set_epoch(epoch)
        batches += [batch.tolist() for batch in loader]
    return batches


@pytest.mark.parametrize('workers', [0, 2])
def test_mid_epoch_continuation_equals_the_uninterrupted_epoch(workers):
    dataset = CountingDataset(10)
    whole_loader = _loader(dataset, DefaultSampler(dataset, seed=7), workers)
    seeded_batch_sampler(whole_loader).number_from(7, 0, 0)
    whole = _epochs(whole_loader, 2)  # 5 batches per epoch

    dataset = CountingDataset(10)
    loader = _loader(dataset, DefaultSampler(dataset, seed=7), workers)
    sampler = seeded_batch_sampler(loader)
    sampler.number_from(7, 0, 7)  # resumed after batch 7 of the run
    loader.batch_sampler.sampler.set_epoch(1)
    advanced, drawn = advance(sampler.inner, 2)
    assert drawn == 2 and dataset.loads == 0  # nothing loaded
    sampler.continue_with(advanced)
    rest = [batch.tolist() for batch in loader]
    assert rest == whole[7:]  # indices and augmentation draws
    if workers == 0:
        assert dataset.loads == 6


def test_batch_draws_do_not_depend_on_the_workers():
    runs = []
    for workers in (0, 2):
        dataset = CountingDataset(9)
        loader = _loader(dataset, DefaultSampler(dataset, seed=1), workers)
        seeded_batch_sampler(loader).number_from(1, 0, 0)
        runs.append(_epochs(loader, 2))
    assert runs[0] == runs[1]
    # the draw of batch n is numpy's first draw after seeding with its seed
    np.random.seed(batch_seed(1, 0, 0))
    assert runs[0][0][0][1] == pytest.approx(np.random.rand(), abs=1e-7)


def test_seeded_batch_keeps_its_seed_through_pickle():
    import pickle

    batch = pickle.loads(pickle.dumps(SeededBatch([3, 1], 42)))
    assert batch.seed == 42
    assert list(batch) == [3, 1] and np.random.get_state()[1][0] == 42


def test_batch_seeds_differ_by_rank_and_number_and_are_stable():
    seeds = {batch_seed(5, r, n) for r in range(2) for n in range(50)}
    assert len(seeds) == 100 and all(0 <= s < 2**32 for s in seeds)
    assert batch_seed(5, 0, 3) == batch_seed(5, 0, 3)


def test_advance_reports_an_epoch_shorter_than_the_checkpoint():
    dataset = CountingDataset(6)
    sampler = BatchSampler(DefaultSampler(dataset, seed=0), 2, False)
    assert advance(sampler, 5) == (None, 3)


def test_aspect_ratio_batches_advanced_without_loading():
    def fresh():
        dataset = CountingDataset(12)
        batches = AspectRatioBatchSampler(
            DefaultSampler(dataset, seed=3), batch_size=2
        )
        return dataset, batches

    dataset, batches = fresh()
    whole = [list(b) for b in batches]
    dataset, batches = fresh()
    advanced, drawn = advance(batches, 3)
    assert drawn == 3 and dataset.loads == 0
    assert [list(b) for b in advanced] == whole[3:]


@pytest.fixture
def no_pass_pause(monkeypatch):
    """mmengine's and our iterator pause 2 s between two passes."""
    monkeypatch.setattr(mmengine_loops.time, 'sleep', lambda s: None)
    monkeypatch.setattr(resume_position.time, 'sleep', lambda s: None)


@pytest.mark.parametrize('sampler_type', [DefaultSampler, InfiniteSampler])
@pytest.mark.parametrize('trained', [3, 4, 9])
def test_iteration_loop_resume_equals_mmengines_iterator(
    sampler_type, trained, no_pass_pause
):
    """8 samples, batches of 2: a pass of a finite sampler is 4 batches;
    resuming after 3, 4 (the end of a pass) and 9 (in the third)."""
    dataset = CountingDataset(8)
    loader = _loader(dataset, sampler_type(dataset, seed=2))
    seeded_batch_sampler(loader).number_from(2, 0, 0)
    uninterrupted = mmengine_loops._InfiniteDataloaderIterator(loader)
    whole = [next(uninterrupted).tolist() for _ in range(trained + 6)]

    dataset = CountingDataset(8)
    loader = _loader(dataset, sampler_type(dataset, seed=2))
    seeded_batch_sampler(loader).number_from(2, 0, trained)
    restored = []
    resumed = ResumedIterator(loader, trained, lambda: restored.append(1))
    assert [next(resumed) for _ in range(trained)] == [None] * trained
    assert dataset.loads == 0 and restored == []
    rest = [next(resumed).tolist() for _ in range(6)]
    assert restored == [1]  # once, before the first fetch
    assert rest == whole[trained:]
    assert dataset.loads == 12


@pytest.mark.parametrize('advance_calls', ['next', 'skip_iter', 'none'])
def test_iteration_loop_advance_as_each_mmengine_makes_it(
    advance_calls, no_pass_pause
):
    """mmengine 0.10.7 calls ``next`` per trained iteration,
    onedl-mmengine 0.10.12 calls ``skip_iter`` once, or nothing with
    ``fast_forward_on_resume=True``: the next batch is the same."""
    dataset = CountingDataset(8)
    loader = _loader(dataset, InfiniteSampler(dataset, seed=4))
    seeded_batch_sampler(loader).number_from(4, 0, 0)
    uninterrupted = mmengine_loops._InfiniteDataloaderIterator(loader)
    whole = [next(uninterrupted).tolist() for _ in range(7)]

    dataset = CountingDataset(8)
    loader = _loader(dataset, InfiniteSampler(dataset, seed=4))
    seeded_batch_sampler(loader).number_from(4, 0, 5)
    free = 0 if advance_calls == 'none' else 5
    resumed = ResumedIterator(loader, free, lambda: None, trained=5)
    if advance_calls == 'next':
        assert [next(resumed) for _ in range(5)] == [None] * 5
    elif advance_calls == 'skip_iter':
        resumed.skip_iter(5)
    assert [next(resumed).tolist() for _ in range(2)] == whole[5:]
    assert dataset.loads == 4
