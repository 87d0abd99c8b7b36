# Copyright (c) mmnanguard contributors. All rights reserved.
"""Replace the batch sampler of a built ``DataLoader``.

torch's ``DataLoader.__setattr__`` refuses to set ``batch_sampler`` once
the loader is built (``ValueError``), although every iterator it makes
reads ``loader.batch_sampler`` afresh (``_index_sampler``). An exact resume
(:mod:`mmnanguard.engine.resume.resume_position`) puts a wrapper there that
continues an already advanced sampler iterator once; this is the one place
that goes around the refusal, and drops the iterator a loader with
``persistent_workers`` keeps (``_iterator``: it reads the batch sampler it
was made with). Checked on torch 2.13 and 2.14;
``tests/test_compat/test_dataloader_batch_sampler.py`` fails on a torch
whose loaders stop reading the attribute.
"""

from typing import Any

from torch.utils.data import DataLoader


def replace_batch_sampler(loader: DataLoader, batch_sampler: Any) -> None:
    """Make ``loader`` draw its batches of indices from ``batch_sampler``.

    Args:
        loader (DataLoader): A built loader with a batch sampler (automatic
            batching).
        batch_sampler: Iterable of index lists with ``__len__``.

    Raises:
        ValueError: ``loader`` does not batch automatically
            (``batch_size=None``): it has no batch sampler to replace.
    """
    if loader.batch_sampler is None:
        raise ValueError(
            'the loader has no batch sampler (batch_size=None): its '
            'position cannot be restored'
        )
    object.__setattr__(loader, 'batch_sampler', batch_sampler)
    # A persistent-workers loader keeps the iterator it made, and that one
    # reads the batch sampler it was made with: drop it (its workers stop
    # when nothing else holds it), so that the next iterator reads this one.
    if getattr(loader, '_iterator', None) is not None:
        loader._iterator = None
