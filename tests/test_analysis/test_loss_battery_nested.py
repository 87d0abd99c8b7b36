# Copyright (c) mmnanguard contributors. All rights reserved.
"""check_loss on what it was not told about: torch's ``CTCLoss`` gets
CTC's cases (an unalignable target is inf with ``zero_infinity=False``,
the values against torch's own ``ctc_loss`` in float64); a loss module
that takes a toolbox's own inputs is exercised through the losses it
holds; one that holds none is reported as not exercised, never as
failing; a loss that does not build alone (its parent passes an
argument) is taken from the built model. mmocr's are
``tests/test_toolboxes/test_mmocr.py``."""

import math

import torch.nn.functional as F
from mmengine.config import Config
from mmengine.model import BaseModel
from mmengine.registry import MODELS
from torch import nn

from mmnanguard.analysis.loss_battery import (
    check_config_losses,
    check_loss_config,
)
from mmnanguard.analysis.loss_battery.ctc import ctc_cases
from mmnanguard.analysis.loss_battery.kinds import context_for
from mmnanguard.analysis.loss_battery.module_check import check_module
from mmnanguard.analysis.loss_battery.table import format_table


def _verdicts(report):
    return {r.case: r.verdict for r in report.results}


def test_ctc_cases_against_torch_in_float64():
    loss = nn.CTCLoss(zero_infinity=False)
    report = check_module(loss, 'model.ctc')
    assert report.kind == 'ctc'
    for case in ctc_cases(context_for(loss)):
        (log_probs, targets, frames, lengths), _ = case.make()
        expected = F.ctc_loss(
            log_probs.detach().double(), targets, frames, lengths
        )
        (result,) = [r for r in report.results if r.case == case.name]
        if math.isinf(expected):
            assert result.verdict == 'non-finite value'
        else:
            assert result.verdict == 'finite'
            assert math.isclose(result.value, expected, rel_tol=1e-4)
    assert len(report.failures) == 2  # the two unalignable targets


def test_zero_infinity_passes_every_case():
    report = check_module(nn.CTCLoss(zero_infinity=True), 'model.ctc')
    assert report.passed and len(report.results) == 5


def test_the_blank_beyond_the_default_classes():
    # mmocr's blank is its dictionary's last index
    report = check_module(nn.CTCLoss(blank=36), 'model.ctc')
    assert not any(r.verdict == 'error' for r in report.results)
    assert len(report.failures) == 2


class TextModuleLoss(nn.Module):
    """A toolbox's loss module: it takes the head's outputs and the data
    samples, and needs the dictionary its parent passes."""

    def __init__(self, dictionary, zero_infinity=False):
        super().__init__()
        self.dictionary = dictionary
        self.ctc_loss = nn.CTCLoss(zero_infinity=zero_infinity)
        self.aux_loss = nn.CrossEntropyLoss()

    def forward(self, outputs, data_samples):
        raise NotImplementedError


class OpaqueLoss(nn.Module):
    def forward(self, outputs, data_samples):
        raise NotImplementedError


def test_a_module_loss_is_exercised_through_the_losses_it_holds():
    report = check_module(TextModuleLoss('abc'), 'model.head.module_loss')
    assert report.kind == 'ctc, classification'
    assert report.exercised == (
        'model.head.module_loss.ctc_loss (CTCLoss), '
        'model.head.module_loss.aux_loss (CrossEntropyLoss)'
    )
    paths = {r.path for r in report.results}
    assert paths == {
        'model.head.module_loss.ctc_loss',
        'model.head.module_loss.aux_loss',
    }
    failing = {(r.path, r.case) for r in report.failures}
    assert (
        'model.head.module_loss.ctc_loss',
        'a target longer than the 12 output frames',
    ) in failing
    table = format_table([report])
    assert 'model.head.module_loss.ctc_loss  CTCLoss' in table
    assert 'the cases ran on the loss it holds' in table


def test_a_loss_with_nothing_known_inside_is_not_exercised():
    report = check_module(OpaqueLoss(), 'model.head.loss')
    assert report.skipped.startswith('not exercised: ')
    assert 'holds no loss module whose inputs are known' in report.skipped
    assert report.passed and report.results == [] and not report.error
    table = format_table([report])
    assert table.endswith(
        '1 loss modules, 0 cases, 0 failing, 1 not exercised'
    )


@MODELS.register_module(force=True)
class ToyTextModuleLoss(TextModuleLoss):
    pass


@MODELS.register_module(force=True)
class ToyRecognizer(BaseModel):
    """Builds its loss with the dictionary, as mmocr's decoders do."""

    def __init__(self, module_loss):
        super().__init__()
        self.module_loss = MODELS.build(dict(module_loss, dictionary='abc'))

    def forward(self, *args, **kwargs):
        raise NotImplementedError


def test_a_loss_that_needs_its_parent_is_taken_from_the_built_model():
    loss_cfg = dict(type='ToyTextModuleLoss', zero_infinity=True)
    alone = check_loss_config(loss_cfg, None, 'model.module_loss')
    assert alone.error.startswith('cannot build it: TypeError')
    assert 'dictionary' in alone.error
    cfg = Config(dict(model=dict(type='ToyRecognizer', module_loss=loss_cfg)))
    (report,) = check_config_losses(cfg)
    assert not report.error
    assert report.exercised.startswith('model.module_loss.ctc_loss (CTCLoss)')
    # zero_infinity=True, from the config, reached the built module
    ctc = [r for r in report.results if r.path.endswith('ctc_loss')]
    assert len(ctc) == 5 and all(r.passed for r in ctc)
