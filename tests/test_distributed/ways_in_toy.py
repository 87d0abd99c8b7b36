# Copyright (c) mmnanguard contributors. All rights reserved.
"""The ways-in toy model and dataset (and variants that draw random
numbers, for the exact resume), registered on import under the
names the ways-in configs give (a config reaches them through
``custom_imports=dict(imports=['ways_in_toy'])``, as a user's own modules
are reached by an upstream ``tools/train.py``)."""

import numpy as np
import torch
from mmengine.registry import DATASETS, MODELS

from mmnanguard.testing.toy import ToyDataset, ToyModel


class JitteredToyDataset(ToyDataset):
    """:class:`ToyDataset` with an augmentation: each sample's inputs get
    noise from numpy's global generator, as a random transform draws."""

    def __getitem__(self, idx):
        sample = super().__getitem__(idx)
        noise = torch.from_numpy(np.random.normal(0, 0.1, 4)).float()
        return dict(sample, inputs=sample['inputs'] + noise)


class DropoutToyModel(ToyModel):
    """:class:`ToyModel` with dropout on its inputs while training (draws
    from torch's global generator in the model, as a head's dropout)."""

    def forward(self, inputs, labels=None, mode: str = 'tensor'):
        if mode == 'loss':
            inputs = torch.nn.functional.dropout(inputs, 0.25)
        return super().forward(inputs, labels, mode)


MODELS.register_module('WaysInToyModel', module=ToyModel, force=True)
MODELS.register_module(
    'WaysInDropoutToyModel', module=DropoutToyModel, force=True
)
DATASETS.register_module('WaysInToyDataset', module=ToyDataset, force=True)
DATASETS.register_module(
    'WaysInJitteredToyDataset', module=JitteredToyDataset, force=True
)
