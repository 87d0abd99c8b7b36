# Copyright (c) mmnanguard contributors. All rights reserved.
"""The doctor's rules that read the built model (on the meta device): a
CTC loss that turns an impossible alignment into ``inf``, and BatchNorm
that is a default of its class rather than written in the config."""

import pytest
import torch
import torch.nn as nn
from mmengine.config import Config
from mmengine.model import BaseModel
from mmengine.registry import MODELS

from mmnanguard.analysis.config_path import resolve_config_path
from mmnanguard.analysis.doctor import run_doctor


@MODELS.register_module(force=True)
class CtcRecognizerToy(BaseModel):
    """A recognizer whose loss module holds an ``nn.CTCLoss`` one level
    down, as mmocr's ``CTCModuleLoss`` does (``decoder.module_loss``)."""

    def __init__(self, zero_infinity: bool = False) -> None:
        super().__init__()
        self.encoder = nn.Linear(8, 8)
        self.decoder = nn.Module()
        self.decoder.module_loss = nn.Module()
        self.decoder.module_loss.ctc_loss = nn.CTCLoss(
            zero_infinity=zero_infinity
        )

    def forward(self, inputs, data_samples=None, mode='tensor'):
        return self.encoder(inputs)


def rules(cfg, batch_size=None):
    if batch_size is not None:
        cfg.train_dataloader.batch_size = batch_size
    return {f.rule: f for f in run_doctor(cfg)}


def ctc_cfg(zero_infinity):
    return Config(
        dict(model=dict(type='CtcRecognizerToy', zero_infinity=zero_infinity))
    )


def test_ctc_without_zero_infinity_is_named_with_its_fix():
    found = rules(ctc_cfg(False))['ctc-zero-infinity']
    assert found.severity == 'warning'
    assert '(model.decoder.module_loss.ctc_loss)' in found.message
    assert found.fix.startswith('model.decoder.module_loss.zero_infinity=True')
    assert found.path == 'model.decoder.module_loss.ctc_loss'
    assert 'ctc-zero-infinity' not in rules(ctc_cfg(True))


@pytest.mark.parametrize('zero_infinity', [False, True])
def test_what_the_ctc_finding_says_holds(zero_infinity):
    """A 5-character label on 4 output frames has no alignment: the loss
    is inf (and its gradient NaN) unless zero_infinity=True."""
    torch.manual_seed(0)
    logits = torch.randn(4, 1, 6, requires_grad=True)  # (T, N, C)
    loss = nn.CTCLoss(zero_infinity=zero_infinity)(
        logits.log_softmax(2),
        torch.tensor([[1, 2, 3, 4, 5]]),
        torch.tensor([4]),
        torch.tensor([5]),
    )
    loss.backward()
    finite = bool(torch.isfinite(loss)) and bool(
        torch.isfinite(logits.grad).all()
    )
    assert finite is zero_infinity


YOLOV3 = 'mmdet::yolo/yolov3_d53_8xb8-320-273e_coco.py'
RETINANET = 'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py'
BEIT = 'mmseg::beit/beit-large_upernet_8xb1-amp-160k_ade20k-640x640.py'


def test_default_batchnorm_of_the_built_model_at_batch_2():
    cfg = Config.fromfile(resolve_config_path(YOLOV3))
    found = rules(cfg, batch_size=2)['batchnorm-small-batch']
    # the neck's ConvModules default to BN; Darknet is norm_eval=True
    assert found.message.startswith(
        '20 BatchNorm module(s) of the built model'
    )
    assert 'eps=1e-05' in found.message
    assert found.path.startswith('model.neck.')
    assert found.fix.startswith(
        "model.neck.norm_cfg=dict(type='BN', eps=1e-3)"
    )
    cfg = Config.fromfile(resolve_config_path(YOLOV3))
    assert 'batchnorm-small-batch' not in rules(cfg, batch_size=8)


def test_frozen_batchnorm_is_not_reported():
    # retinanet's ResNet: norm_eval=True; FPN and head have no BatchNorm
    cfg = Config.fromfile(resolve_config_path(RETINANET))
    assert 'batchnorm-small-batch' not in rules(cfg, batch_size=2)


def test_a_model_that_does_not_build_on_meta_is_said():
    cfg = Config.fromfile(resolve_config_path(BEIT))
    found = rules(cfg)['model-not-built']
    assert found.severity == 'info'
    assert 'Tensor.item() cannot be called on meta tensors' in found.message
