# Copyright (c) mmnanguard contributors. All rights reserved.
"""Unit tests of the diagnosis parts: output walking, the probe, the batch
checks, the growth rule, the fp32 replay under AMP and the incident-file
check, each against a hand calculation."""

import json
import math
import os
import os.path as osp

import pytest
import torch
from mmdet.structures import DetDataSample
from mmdet.structures.bbox import HorizontalBoxes
from mmengine.structures import InstanceData, PixelData
from mmrotate.structures.bbox import RotatedBoxes
from mmseg.structures import SegDataSample
from torch import nn

from mmnanguard.engine.diagnosis import (
    ActivationProbe,
    NotAnIncidentError,
    check_batch,
    diagnose,
    load_incident,
    replay_batch,
    verdict_lines,
)
from mmnanguard.engine.diagnosis.explosion import grad_norm_growth
from mmnanguard.engine.diagnosis.tree import first_nonfinite
from mmnanguard.engine.hooks import NanDiagnosisHook
from mmnanguard.testing.toy import ToyModel

BAD = [float('nan'), float('inf'), -float('inf')]


@pytest.mark.parametrize('bad', BAD)
def test_first_nonfinite_walks_nested_outputs(bad):
    boxes = torch.zeros(3, 5)
    boxes[2, 3] = bad
    inst = InstanceData(
        bboxes=RotatedBoxes(boxes), scores=torch.ones(3), labels=torch.ones(3)
    )
    out = dict(a=(torch.ones(2), [torch.zeros(0)]), b=[inst])
    found = first_nonfinite(out)
    assert found['path'] == "['b'][0].bboxes.tensor"
    key = {True: 'nan'}.get(math.isnan(bad), 'posinf' if bad > 0 else 'neginf')
    assert found[key] == 1 and found['numel'] == 15
    assert first_nonfinite(dict(a=torch.ones(2), b=[torch.zeros(0)])) is None
    assert first_nonfinite(torch.tensor([1, 2])) is None  # integers


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.act = nn.ReLU(inplace=True)  # mmdet style, in place
        self.fc2 = nn.Linear(8, 8)
        self.fc3 = nn.Linear(8, 1)

    def forward(self, x):
        h = self.fc2(self.act(self.fc1(x)))
        return self.fc3(h), h


def test_probe_names_first_forward_and_backward_module():
    net = Net()
    with torch.no_grad():
        net.fc1.weight.fill_(1.0)  # fc1 -> relu: 4 + bias, finite
        net.fc2.weight.fill_(1e38)  # 8 inputs of ~4 each: 3e39 > fp32 max
    x = torch.ones(2, 4)
    with ActivationProbe(net) as probe:
        net(x)
    assert probe.forward_first['module'] == 'fc2'
    assert probe.forward_first['inputs_finite']
    assert all(not m._forward_hooks for m in net.modules())

    net = Net()
    with ActivationProbe(net) as probe:
        out, h = net(x)
        # sqrt at 0 on fc2's output: its gradient is NaN first there
        loss = out.sum() + torch.sqrt(((h - h.detach()) ** 2).sum())
        loss.backward()
    assert probe.forward_first is None
    assert probe.grad_first['module'] == 'fc2'
    # backward order: fc2's parameters get NaN before fc1's
    names = [p['name'] for p in probe.param_grads]
    assert names[:2] in (
        ['fc2.weight', 'fc2.bias'],
        ['fc2.bias', 'fc2.weight'],
    )
    assert 'fc3.weight' not in names
    assert set(names) == {'fc2.weight', 'fc2.bias', 'fc1.weight', 'fc1.bias'}


def _det_sample(path, boxes, labels):
    sample = DetDataSample(metainfo=dict(img_path=path, img_id=path))
    sample.gt_instances = InstanceData(
        bboxes=boxes, labels=torch.tensor(labels)
    )
    return sample


def test_check_batch_names_sample_and_instance():
    hb = HorizontalBoxes(
        torch.tensor([[0, 0, 10, 10], [5, 5, 5, 9], [1, 1, 3, 3.0]])
    )
    rb = RotatedBoxes(torch.tensor([[50, 50, 10, 4, 0.1], [50, 50, 8, 0, 0]]))
    img = torch.zeros(3, 8, 8)
    img[0, 1, 1] = float('inf')
    batch = dict(
        inputs=[torch.zeros(3, 8, 8, dtype=torch.uint8), img],
        data_samples=[
            _det_sample('a.png', hb, [0, 1, 7]),
            _det_sample('b.png', rb, [2, 2]),
        ],
    )
    found = check_batch(batch, None, num_classes=3)
    got = {(f['check'], f['sample'], f['index'], f['img_path']) for f in found}
    assert got == {
        ('image_finite', 1, None, 'b.png'),
        ('hbox_size', 0, 1, 'a.png'),  # x2 - x1 = 0
        ('label_range', 0, 2, 'a.png'),  # 7 >= 3
        ('rbox_size', 1, 1, 'b.png'),  # h = 0
    }


def test_check_batch_seg_values():
    sample = SegDataSample(metainfo=dict(seg_map_path='m.png'))
    seg = torch.tensor([[[0, 18, 255, 19]]])
    sample.gt_sem_seg = PixelData(data=seg)
    batch = dict(inputs=[torch.zeros(3, 1, 4)], data_samples=[sample])
    found = check_batch(batch, None, num_classes=19, ignore_index=255)
    assert [(f['check'], f['values']) for f in found] == [('seg_values', [19])]
    assert found[0]['seg_map_path'] == 'm.png'


def test_grad_norm_growth_hand_computed():
    history = [
        dict(iteration=i, grad_norm=g, lr=lr)
        for i, (g, lr) in enumerate(
            [(2.0, 0.1), (1.0, 0.2), (30.0, 0.4), (1e4, 0.8), ('inf', 1.6)]
        )
    ]
    growth = grad_norm_growth(history, iteration=4)
    assert growth['ratio'] == 1e4 / 1.0 and growth['from_iter'] == 1
    assert growth['to_iter'] == 3 and growth['orders'] == pytest.approx(4)
    assert (growth['lr_from'], growth['lr_to']) == (0.1, 1.6)
    assert grad_norm_growth(history[:2], iteration=1) is None


def test_fp16_overflow_is_told_apart_by_the_fp32_replay():
    model = ToyModel()
    with torch.no_grad():
        model.a.weight.fill_(3e4)  # 4 inputs of 1: 1.2e5 > fp16 max 65504
    batch = dict(
        data_batch=dict(inputs=torch.ones(2, 4), labels=torch.zeros(2, 1)),
        rng_state=None,
    )
    report = dict(kind='nonfinite_loss', iteration=3, history=[])
    read = dict(report)
    found = diagnose(
        model,
        report,
        batch,
        replay_state='test',
        amp_dtype=torch.float16,
        loss_scale=1024.0,
    )
    assert report == read  # the diagnosis is a value; the report unchanged
    found.apply_to(report)
    assert report['diagnosis']['verdict'] == verdict_lines(report)
    ev = report['evidence']
    assert ev['replay']['precision'] == 'float16'
    assert ev['replay']['forward_first']['module'] == 'a'
    assert ev['fp32_replay']['finite']
    assert (
        report['cause'] == 'forward' and report['diagnosis']['fp16_overflow']
    )
    assert 'bf16' in report['diagnosis']['remedy'][0]


class Evil:
    """Unpickling it would create a file."""

    def __reduce__(self):
        return (os.mkdir, ('/tmp/nanguard_evil_was_here',))


def test_load_incident_refuses_what_is_not_an_incident(tmp_path):
    folder = tmp_path / 'incident_000_iter000003'
    folder.mkdir()
    (folder / 'report.json').write_text(
        '{"kind": "nonfinite_loss", "iteration": 3}'
    )
    torch.save(
        dict(data_batch=Evil(), rng_state={}, iteration=3),
        folder / 'batch.pth',
    )
    with pytest.raises(NotAnIncidentError, match='Evil|mkdir'):
        load_incident(str(folder))
    assert not osp.exists('/tmp/nanguard_evil_was_here')
    other = tmp_path / 'my_folder'
    other.mkdir()
    with pytest.raises(NotAnIncidentError, match='not an incident folder'):
        load_incident(str(other))


def _toy_run(tmp_path, hooks, **guard):
    from mmengine.runner import Runner

    from mmnanguard.testing.toy import toy_runner_cfg

    cfg = toy_runner_cfg(
        str(tmp_path),
        max_iters=4,
        custom_hooks=hooks
        + [dict(type='NanGuardHook', **guard), dict(type='NanDiagnosisHook')],
    )
    runner = Runner(**cfg)
    runner.train()
    folders = sorted((tmp_path / 'nanguard').glob('incident_*'))
    with open(folders[0] / 'report.json') as f:
        return runner, json.load(f)


def test_param_incident_replays_from_the_exact_snapshot(tmp_path):
    # NaN momentum at iteration 2: the step makes the weights NaN, the
    # gradients of the (pre-step) replay are finite
    _, report = _toy_run(
        tmp_path,
        [
            dict(
                type='FaultInjectionHook',
                fault='nan_optimizer_state',
                iteration=2,
            )
        ],
        policy='rollback',
        snapshot_interval=1,
    )
    assert report['kind'] == 'nonfinite_params' and report['iteration'] == 2
    assert report['cause'] == 'optimizer'
    assert report['evidence']['replay']['finite']
    assert report['evidence']['optimizer_state'] == ['state.0.momentum_buffer']
    assert report['diagnosis']['replay_state'].startswith(
        'the guard snapshot of iteration 2: exactly'
    )


class SqrtToy(ToyModel):
    """A loss term sqrt(0) on a parameter: value 0, gradient NaN."""

    def forward(self, inputs, labels=None, mode='tensor'):
        out = super().forward(inputs, labels, mode)
        if mode == 'loss':
            w = self.b.weight
            out['loss_sqrt'] = torch.sqrt(((w - w.detach()) ** 2).sum())
        return out


def test_anomaly_mode_names_the_failing_op():
    model = SqrtToy()
    batch = dict(inputs=torch.ones(2, 4), labels=torch.zeros(2, 1))
    result = replay_batch(model, batch, anomaly=True)['result']
    # sqrt'(0) = inf, times d(x**2)/dw = 0: the pow's backward makes the NaN
    assert "Function 'PowBackward0' returned nan" in result.anomaly
    assert "out['loss_sqrt'] = torch.sqrt(" in result.anomaly  # forward line
    plain = replay_batch(model, batch)['result']
    assert plain.anomaly is None
    assert [p['name'] for p in plain.param_grads] == ['b.weight']
    assert plain.term_grads == dict(loss_a=True, loss_b=True, loss_sqrt=False)


def test_a_repeat_names_the_diagnosis_it_repeats(tmp_path):
    # the same kind, stage and samples three times: the fault hook is gone
    # when the replay runs, so the first is transient; the second, the
    # same samples again, is diagnosed again as recurring; the third
    # repeats that diagnosis
    runner, first = _toy_run(
        tmp_path,
        [
            dict(type='FaultInjectionHook', fault='inf_loss', iteration=i)
            for i in (0, 1, 3)
        ],
        policy='skip',
    )
    folders = sorted((tmp_path / 'nanguard').glob('incident_*'))
    assert [f.name for f in folders] == [
        'incident_000_iter000000',
        'incident_001_iter000001',
        'incident_002_iter000003',
    ]
    assert first['cause'] == 'transient' and first['stage'] == 'loss'
    second, third = (
        json.loads((folder / 'report.json').read_text())
        for folder in folders[1:]
    )
    assert second['cause'] == 'recurring' and 'repeat_of' not in second
    assert (
        'at iteration 0 (incident_000_iter000000)'
        in (second['diagnosis']['summary'])
    )
    assert 'cause' not in third
    assert third['repeat_of'] == dict(
        folder='incident_001_iter000001',
        iteration=1,
        cause='recurring',
        stage='loss',
        summary=second['diagnosis']['summary'],
    )
    text = (folders[2] / 'report.md').read_text()
    assert 'repeat of `incident_001_iter000001`' in text


@pytest.mark.parametrize('bound', [1, 5])
def test_distinct_incidents_are_diagnosed_up_to_the_bound(tmp_path, bound):
    from mmengine.runner import Runner

    from mmnanguard.testing.toy import toy_runner_cfg

    cfg = toy_runner_cfg(
        str(tmp_path),
        max_iters=4,
        custom_hooks=[
            dict(type='FaultInjectionHook', fault='inf_loss', iteration=1),
            dict(type='FaultInjectionHook', fault='nan_grad', iteration=3),
            dict(type='NanGuardHook', policy='skip'),
            dict(type='NanDiagnosisHook', max_diagnoses=bound),
        ],
    )
    Runner(**cfg).train()
    reports = []
    for folder in sorted((tmp_path / 'nanguard').glob('incident_*')):
        with open(folder / 'report.json') as f:
            reports.append(json.load(f))
    assert [(r['kind'], r['stage']) for r in reports] == [
        ('nonfinite_loss', 'loss'),
        ('nonfinite_grad', 'backward'),
    ]
    assert reports[0]['cause'] == 'transient'
    if bound == 1:
        assert 'cause' not in reports[1]
        assert reports[1]['diagnosis_skipped'].startswith('max_diagnoses=1')
    else:  # a different kind and stage: diagnosed on its own
        assert reports[1]['cause'] == 'transient'
        assert 'stage `backward`' in reports[1]['diagnosis']['summary']


@pytest.mark.parametrize('value', [-1, 1.5, True, 'all'])
def test_max_diagnoses_is_validated(value):
    with pytest.raises(ValueError, match=f'max_diagnoses={value!r}'):
        NanDiagnosisHook(max_diagnoses=value)
    with pytest.raises(ValueError, match=f'diagnose_incidents={value!r}'):
        NanDiagnosisHook(diagnose_incidents=value)
