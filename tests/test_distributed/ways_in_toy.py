# Copyright (c) mmnanguard contributors. All rights reserved.
"""The ways-in toy model and dataset, registered on import under the
names the ways-in configs give (a config reaches them through
``custom_imports=dict(imports=['ways_in_toy'])``, as a user's own modules
are reached by an upstream ``tools/train.py``)."""

from mmengine.registry import DATASETS, MODELS

from mmnanguard.testing.toy import ToyDataset, ToyModel

MODELS.register_module('WaysInToyModel', module=ToyModel, force=True)
DATASETS.register_module('WaysInToyDataset', module=ToyDataset, force=True)
