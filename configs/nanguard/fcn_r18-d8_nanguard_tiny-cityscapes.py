# The tiny mmseg FCN on Cityscapes with mmnanguard's protection: one added
# `_base_` entry. Its CrossEntropyLoss becomes CheckedCrossEntropyLoss, so a
# label outside the classes that is not the ignore_index stops training
# with an error naming the value.
_base_ = [
    '../tiny/fcn_r18-d8_tiny-cityscapes.py',
    'mmnanguard::_base_/nanguard.py',
]
