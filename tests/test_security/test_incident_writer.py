# Copyright (c) mmnanguard contributors. All rights reserved.
"""The incident writer says at once when replay would refuse a batch."""

import torch
from mmengine.structures import InstanceData

from mmnanguard.engine.diagnosis import load_incident
from mmnanguard.engine.incident import IncidentRecorder, replay_refusal


class Stranger:
    """A harmless class that is not on the batch allowlist."""


def _record(tmp_path, data_batch):
    recorder = IncidentRecorder(str(tmp_path), 5, rank=0, world_size=1)
    report = dict(iteration=3, kind='nonfinite_loss')
    batch = dict(data_batch=data_batch, rng_state={}, iteration=3)
    return recorder.record(report, batch)


def test_honest_batch_is_loadable(tmp_path):
    instances = InstanceData(labels=torch.tensor([1, 2]))
    folder = _record(tmp_path, dict(inputs=[torch.ones(3)], gt=instances))
    assert replay_refusal(f'{folder}/batch.pth') is None
    _, batch = load_incident(folder)
    loaded = batch['data_batch']['gt']
    assert type(loaded) is InstanceData
    assert torch.equal(loaded.labels, torch.tensor([1, 2]))


def test_batch_with_a_foreign_object_is_named_when_written(tmp_path):
    folder = _record(tmp_path, dict(meta=Stranger()))
    refusal = replay_refusal(f'{folder}/batch.pth')
    assert refusal is not None
    assert 'test_incident_writer.Stranger' in refusal
    assert f'{folder}/batch.pth' in refusal
