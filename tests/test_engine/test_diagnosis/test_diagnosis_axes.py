# Copyright (c) mmnanguard contributors. All rights reserved.
"""The parts behind the stage axis, the magnitude rule, the schedule rule
and the drop-in lookup, each against a hand calculation or the upstream
module itself."""

from types import SimpleNamespace

import pytest
import torch
from mmdet.models.losses import FocalLoss
from mmdet.structures import DetDataSample
from mmengine.optim.scheduler import LinearLR, MultiStepLR
from mmengine.structures import InstanceData
from mmrotate.models.losses import GDLoss
from mmrotate.structures.bbox import RotatedBoxes
from mmseg.models.losses import CrossEntropyLoss
from torch import nn

from mmnanguard.engine.diagnosis import ActivationProbe, diagnose
from mmnanguard.engine.diagnosis.drop_ins import (
    SAFE_MODULES_INCLUDE,
    loss_modules,
)
from mmnanguard.engine.diagnosis.explosion import loss_growth, lr_off_schedule
from mmnanguard.engine.diagnosis.magnitude import first_out_of_range
from mmnanguard.engine.guard.input_check import batch_tensors, finite_flag
from mmnanguard.engine.guard.scheduled_lr import ScheduledLr
from mmnanguard.engine.guard.spike_detector import Spike
from mmnanguard.engine.guard.stage import live_stage
from mmnanguard.engine.guard.step_guard import StepGuard
from mmnanguard.engine.guard.verdict import StepVerdict
from mmnanguard.testing.toy import ToyModel


class Chain(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.act = nn.ReLU(inplace=True)
        self.fc2 = nn.Linear(8, 8)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


@pytest.mark.parametrize(
    'scale, reason', [(1e7, 'orders of magnitude'), (1e30, 'beyond 1e+30')]
)
def test_first_out_of_range_hand_computed(scale, reason):
    net = Chain()
    with torch.no_grad():
        net.fc1.weight.fill_(1.0)  # 4 ones -> 4.0 each, ReLU keeps it
        net.fc1.bias.zero_()
        net.fc2.weight.fill_(scale)  # 8 inputs of 4.0: 32 * scale
        net.fc2.bias.zero_()
    with ActivationProbe(net) as probe:
        net(torch.ones(2, 4))
    by_module = {m['module']: m for m in probe.magnitudes}
    assert by_module['fc1']['out_max'] == 4.0
    assert by_module['fc1']['weight_max'] == 1.0
    assert by_module['act']['weight_max'] is None
    first = first_out_of_range(probe.magnitudes)
    assert first['module'] == 'fc2' and reason in first['reason']
    assert first['in_max'] == 4.0
    assert first['out_max'] == pytest.approx(32 * scale, rel=1e-6)
    assert first['weight_max'] == pytest.approx(scale, rel=1e-6)
    assert first['weights_out_of_range']
    # in range under fp32, beyond the fp16 range (65504) under fp16
    with torch.no_grad():
        net.fc2.weight.fill_(1e3)  # 32000 from 4.0: 4 orders, finite
    with ActivationProbe(net) as probe:
        net(torch.ones(2, 4))
    assert first_out_of_range(probe.magnitudes) is None
    with torch.no_grad():
        net.fc2.weight.fill_(1e4)  # 320000 > 65504
    with ActivationProbe(net) as probe:
        net(torch.ones(2, 4))
    assert first_out_of_range(probe.magnitudes, 'float16')['module'] == 'fc2'


def test_lr_off_schedule_and_loss_growth_hand_computed():
    history = [
        dict(iteration=0, lr=1e-3, lr_scheduled=1e-3, loss_terms=dict(loss=2)),
        dict(iteration=1, lr=2e-3, lr_scheduled=2e-3, loss_terms=dict(loss=1)),
        dict(iteration=2, lr=5.0, lr_scheduled=4e-3, loss_terms=dict(loss=50)),
        dict(
            iteration=3, lr=6.0, lr_scheduled=None, loss_terms=dict(loss='nan')
        ),
    ]
    off = lr_off_schedule(history, iteration=3)
    assert off == dict(
        ratio=5.0 / 4e-3, iteration=2, group=0, lr=5.0, lr_scheduled=4e-3
    )
    assert lr_off_schedule(history[:2], iteration=1)['ratio'] == 1.0
    grown = loss_growth(history, iteration=3)
    assert grown['ratio'] == 50.0 and grown['from_iter'] == 1
    assert grown['to_iter'] == 2
    assert loss_growth(history[:2], iteration=1) is None  # 2 points


def test_scheduled_lr_follows_iteration_and_epoch_schedulers():
    param = nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=0.1)
    warmup = LinearLR(optimizer, start_factor=0.1, by_epoch=False, end=5)
    steps = MultiStepLR(optimizer, milestones=[1], gamma=0.1, by_epoch=True)
    runner = SimpleNamespace(param_schedulers=[warmup, steps])
    tracker, seen = ScheduledLr(), []
    for _epoch in range(2):
        for _ in range(3):  # 3 iterations per epoch
            seen.append(tracker.read(runner, 0.1))
            warmup.step()
        steps.step()
    # by hand: LinearLR over end - begin - 1 = 4 steps, x0.1 from epoch 1
    expected = [
        0.1 * (0.1 + 0.9 * min(t, 4) / 4) * (0.1 if t >= 3 else 1.0)
        for t in range(6)
    ]
    assert seen == pytest.approx(expected, rel=1e-12)
    # a hand-set lr is not what the schedule prescribes
    optimizer.param_groups[0]['lr'] = 7.0
    assert tracker.read(runner, 0.1) == pytest.approx(expected[-1] * 1.0)
    # no scheduler: the starting lr, times the guard's backoff
    assert (
        ScheduledLr().read(SimpleNamespace(param_schedulers=None), 0.1, 0.5)
        == 0.05
    )


def _sample(boxes):
    sample = DetDataSample()
    sample.gt_instances = InstanceData(bboxes=RotatedBoxes(boxes))
    return sample


@pytest.mark.parametrize('where', ['image', 'box', None])
def test_input_flag_is_read_with_the_loss_check(where):
    images = torch.zeros(2, 3, 4, 4)
    boxes = torch.tensor([[5.0, 5.0, 4.0, 2.0, 0.1]])
    if where == 'image':
        images[1, 2, 3, 3] = float('nan')
    elif where == 'box':
        boxes[0, 2] = float('inf')
    data = dict(inputs=images, data_samples=[_sample(boxes), _sample(boxes)])
    assert len(batch_tensors(data)) == 3
    flag = finite_flag(batch_tensors(data))
    assert flag.dim() == 0 and bool(flag) is (where is None)
    guard = StepGuard({})
    guard.begin_iteration(0)
    guard.note_inputs(flag)
    owner = object()
    guard.note_loss(owner, torch.tensor(1.5))  # the loss is finite
    verdict = guard.read(owner, [])  # the flag travels in the step's read
    assert verdict.loss_finite
    assert verdict.inputs_finite is (where is None)
    assert finite_flag(batch_tensors(dict(inputs=[]))) is None


@pytest.mark.parametrize(
    'dtype', [torch.float32, torch.float16, torch.bfloat16]
)
@pytest.mark.parametrize(
    'planted', [None, float('nan'), float('inf'), -float('inf')]
)
def test_input_flag_does_not_overflow_on_finite_extremes(dtype, planted):
    # GDAL's NoData value in float32 tiles: finite, but two of them
    # overflow a float32 sum; every pixel at the dtype's largest magnitude
    finfo = torch.finfo(dtype)
    images = torch.full((2, 3, 8, 8), finfo.max, dtype=dtype)
    images[1] = finfo.min
    images[0, 0, 0, :4] = finfo.min
    if dtype is not torch.float16:  # a float32 sum overflows on them
        assert not torch.isfinite(images.sum(dtype=torch.float32))
    if planted is not None:
        images[1, 2, 7, 7] = planted
    flag = finite_flag([images])
    expected = bool(torch.isfinite(images).all())
    assert expected is (planted is None)
    assert bool(flag) is expected


@pytest.mark.parametrize(
    'kind, verdict, stage',
    [
        (
            'nonfinite_loss',
            dict(loss_finite=False, inputs_finite=False),
            'data',
        ),
        (
            'nonfinite_loss',
            dict(loss_finite=False, inputs_finite=True),
            'loss',
        ),
        (
            'nonfinite_grad',
            dict(grad_finite=False, grad_norm=float('nan')),
            'backward',
        ),
        # the parameter check is read with the next step, whose inputs
        # are not those of the bad step
        ('nonfinite_params', dict(inputs_finite=False), 'optimizer'),
        ('nonfinite_checkpoint', dict(), 'checkpoint'),
        (
            'grad_spike',
            dict(spikes=[Spike('grad', 'grad_norm', 50.0, 1.0, 10.0)]),
            'backward',
        ),
        (
            'loss_spike',
            dict(spikes=[Spike('loss', 'loss_a', 50.0, 1.0, 10.0)]),
            'loss',
        ),
    ],
)
def test_live_stage_from_the_guard_evidence(kind, verdict, stage):
    found = live_stage(kind, StepVerdict(iteration=3, **verdict))
    assert found['stage'] == stage and found['live']['stage'] == stage
    if kind == 'nonfinite_grad':
        assert found['live']['grad_norm'] == 'nan'  # JSON-safe
    if kind.endswith('spike'):
        assert 'x running max 1' in found['live']['text']


def test_loss_modules_are_found_in_the_built_model():
    class Head(nn.Module):
        def __init__(self, loss):
            super().__init__()
            self.loss_cls = loss

    model = nn.Module()
    model.rpn_head = Head(FocalLoss())
    model.bbox_head = Head(FocalLoss())
    model.decode_head = nn.Module()
    model.decode_head.loss_decode = CrossEntropyLoss(loss_name='loss_ce')
    found = loss_modules(
        model, ['loss', 'loss_rpn_cls', 'loss_cls', 'decode.loss_ce']
    )
    assert [(f['term'], f['config_path'], f['drop_in']) for f in found] == [
        ('loss_rpn_cls', 'model.rpn_head.loss_cls', 'StableFocalLoss'),
        ('loss_cls', 'model.bbox_head.loss_cls', 'StableFocalLoss'),
        ('decode.loss_ce', 'model.decode_head.loss_decode', None),
    ]


class BoxToy(ToyModel):
    """A box term through mmrotate's own ``GDLoss(kld)`` whose gradient is
    NaN while its value is finite (a ``sqrt(0)`` added to it: on this CPU
    upstream's thin-box NaN shows in the value already)."""

    def __init__(self):
        super().__init__()
        self.loss_bbox = GDLoss('kld', fun='log1p', tau=1.0)

    def forward(self, inputs, labels=None, mode='tensor'):
        out = super().forward(inputs, labels, mode)
        if mode == 'loss':
            w = self.b.weight
            pred = torch.cat([w[:, :4].abs() + 1.0, w[:, :1] * 0], dim=1)
            target = torch.tensor([[1.0, 1.0, 2.0, 1.0, 0.0]])
            out['loss_bbox'] = self.loss_bbox(pred, target) + torch.sqrt(
                ((w - w.detach()) ** 2).sum()
            )
        return out


def test_backward_remedy_names_the_drop_in_and_the_first_parameter():
    model = BoxToy()
    report = dict(kind='nonfinite_grad', iteration=1, history=[])
    batch = dict(
        data_batch=dict(inputs=torch.ones(2, 4), labels=torch.zeros(2, 1)),
        rng_state=None,
    )
    diagnose(model, report, batch, replay_state='test').apply_to(report)
    assert report['cause'] == 'backward' and report['stage'] == 'backward'
    replay = report['evidence']['replay']
    assert replay['term_grads'] == dict(
        loss_a=True, loss_b=True, loss_bbox=False
    )
    assert [p['name'] for p in replay['param_grads']] == ['b.weight']
    remedy = report['diagnosis']['remedy']
    assert '`GDLoss` at `model.loss_bbox`' in remedy[0]
    assert "dict(type='SafeGDLoss', ...)" in remedy[0]
    assert SAFE_MODULES_INCLUDE in remedy[0]
    assert '`b.weight`' in remedy[1]


def test_drop_ins_of_the_built_rotated_retinanet():
    from mmengine.config import Config
    from mmengine.registry import MODELS, init_default_scope

    from mmnanguard.engine.diagnosis.drop_ins import box_coders
    from mmnanguard.engine.diagnosis.remedy import remedies
    from mmnanguard.engine.diagnosis.replay import ReplayResult
    from mmnanguard.testing import TINY_DOTA_CONFIG

    cfg = Config.fromfile(TINY_DOTA_CONFIG)
    init_default_scope(cfg.default_scope)
    model = MODELS.build(cfg.model)
    found = loss_modules(model, ['loss', 'loss_cls', 'loss_bbox'])
    assert [(f['type'], f['config_path'], f['drop_in']) for f in found] == [
        (
            type(model.bbox_head.loss_cls).__name__,
            'model.bbox_head.loss_cls',
            'StableFocalLoss',
        ),
        (
            type(model.bbox_head.loss_bbox).__name__,
            'model.bbox_head.loss_bbox',
            None,
        ),
    ]
    coders = box_coders(model)
    assert [(c['config_path'], c['drop_in']) for c in coders] == [
        ('model.bbox_head.bbox_coder', 'SafeDeltaXYWHTRBBoxCoder')
    ]
    lines = remedies(
        dict(
            cause='loss',
            evidence=dict(loss_modules=found, box_coders=coders),
        ),
        ReplayResult(nonfinite_terms=['loss', 'loss_bbox']),
    )
    assert 'has no mmnanguard drop-in' in lines[0]  # the L1 box loss
    assert '`DeltaXYWHTRBBoxCoder` at `model.bbox_head.bbox_coder`' in lines[1]
    assert "dict(type='SafeDeltaXYWHTRBBoxCoder', ...)" in lines[1]
