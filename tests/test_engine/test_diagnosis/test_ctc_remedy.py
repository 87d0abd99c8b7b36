# Copyright (c) mmnanguard contributors. All rights reserved.
"""A CTC loss that went infinite gets CTC's own remedy (zero_infinity on
the module that takes it), found in the built model whether the loss
module is the ``nn.CTCLoss`` itself or holds it (mmocr's
``CTCModuleLoss``); the end-to-end case is
``tests/test_toolboxes/test_mmocr.py``."""

import pytest
import torch.nn as nn

from mmnanguard.engine.diagnosis.drop_ins import module_entry
from mmnanguard.engine.diagnosis.remedy import _drop_in_lines


class Recognizer(nn.Module):
    def __init__(self, zero_infinity):
        super().__init__()
        self.decoder = nn.Module()
        self.decoder.module_loss = nn.Module()
        self.decoder.module_loss.ctc_loss = nn.CTCLoss(
            zero_infinity=zero_infinity
        )


@pytest.mark.parametrize(
    'name', ['decoder.module_loss', 'decoder.module_loss.ctc_loss']
)
def test_the_ctc_loss_and_its_owner_are_found(name):
    entry = module_entry(Recognizer(False), name)
    assert entry['ctc'] == dict(
        module='decoder.module_loss.ctc_loss',
        zero_infinity=False,
        config_path='model.decoder.module_loss',
    )
    (line,) = _drop_in_lines([entry])
    assert 'is a CTC loss with zero_infinity=False' in line
    assert '`model.decoder.module_loss.zero_infinity=True`' in line
    assert 'log(0)' not in line


def test_zero_infinity_true_gets_the_generic_line():
    entry = module_entry(Recognizer(True), 'decoder.module_loss.ctc_loss')
    assert entry['ctc']['zero_infinity'] is True
    (line,) = _drop_in_lines([entry])
    assert 'has no mmnanguard drop-in' in line


def test_a_module_without_ctc_has_no_ctc_entry():
    model = nn.Module()
    model.loss_cls = nn.CrossEntropyLoss()
    assert 'ctc' not in module_entry(model, 'loss_cls')
