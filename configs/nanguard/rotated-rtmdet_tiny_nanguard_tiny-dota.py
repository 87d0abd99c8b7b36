# Rotated RTMDet-tiny (its custom_hooks keep their EMAHook) with mmnanguard's
# protection: one added `_base_` entry.
_base_ = [
    '../tiny/rotated-rtmdet_tiny_tiny-dota.py',
    'mmnanguard::_base_/nanguard.py',
]
