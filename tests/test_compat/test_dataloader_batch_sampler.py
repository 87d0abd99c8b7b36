# Copyright (c) mmnanguard contributors. All rights reserved.
"""torch's loaders read the batch sampler that
``replace_batch_sampler`` puts in place, in this process and in
persistent workers made before the replacement."""

import pytest
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

from mmnanguard.compat.dataloader_batch_sampler import replace_batch_sampler


class Reversed:
    def __init__(self, inner):
        self.inner = inner

    def __iter__(self):
        return reversed(list(self.inner))

    def __len__(self):
        return len(self.inner)


@pytest.mark.parametrize('workers', [0, 2])
def test_loader_reads_the_replaced_batch_sampler(workers):
    data = list(range(6))
    batches = BatchSampler(SequentialSampler(data), 2, False)
    loader = DataLoader(
        data,
        batch_sampler=batches,
        num_workers=workers,
        persistent_workers=workers > 0,
    )
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5]]
    with pytest.raises(ValueError):  # what torch refuses
        loader.batch_sampler = Reversed(batches)
    replace_batch_sampler(loader, Reversed(batches))
    assert [b.tolist() for b in loader] == [[4, 5], [2, 3], [0, 1]]
    assert len(loader) == 3


def test_loader_without_batch_sampler_is_refused_by_name():
    loader = DataLoader(list(range(4)), batch_size=None)
    with pytest.raises(ValueError, match='batch_size=None'):
        replace_batch_sampler(loader, [[0]])
