# Copyright (c) mmnanguard contributors. All rights reserved.
"""``assert_loss_stable`` in a user's test suite: it names the failing
cases of two broken custom losses and of mmrotate's KLD, and passes our
safe drop-in."""

import pytest
from custom_losses import HandWrittenCELoss, ZeroDenominatorDiceLoss

from mmnanguard.testing import assert_loss_stable


def test_hand_written_cross_entropy_is_named():
    with pytest.raises(AssertionError) as err:
        assert_loss_stable(dict(type='HandWrittenCELoss'))
    message = str(err.value)
    assert message.startswith('HandWrittenCELoss (classification) fails')
    # log(softmax) of a saturated logit is -inf, and 0 * -inf is NaN
    assert 'logits ±1e4 [predictions]: non-finite value, value nan' in message
    assert 'nominal' not in message


def test_zero_denominator_dice_is_named():
    with pytest.raises(AssertionError) as err:
        assert_loss_stable(ZeroDenominatorDiceLoss())
    message = str(err.value)
    assert 'ZeroDenominatorDiceLoss (mask) fails' in message
    assert (
        'probabilities exactly 0, empty masks [predictions]: non-finite '
        'value, value nan' in message
    )


def test_kld_is_named_and_the_drop_in_passes():
    with pytest.raises(AssertionError, match='zero-width target box'):
        assert_loss_stable(
            dict(type='GDLoss', loss_type='kld'), scope='mmrotate'
        )
    assert_loss_stable(
        dict(type='SafeGDLoss', loss_type='kld'), scope='mmrotate'
    )


def test_kind_can_be_given():
    # a hand-written CE fed as a segmentation loss fails there too
    with pytest.raises(AssertionError, match=r'\(segmentation\) fails'):
        assert_loss_stable(HandWrittenCELoss(), kind='segmentation')


def test_bad_argument_is_refused():
    with pytest.raises(TypeError, match='got int'):
        assert_loss_stable(3)
    with pytest.raises(ValueError, match='kind must be one of'):
        assert_loss_stable(HandWrittenCELoss(), kind='boxes')
