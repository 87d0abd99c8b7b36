# The tiny rotated RetinaNet (the unmodified mmrotate config, shrunk for the
# CPU) with mmnanguard's protection: one added `_base_` entry.
_base_ = [
    '../tiny/rotated-retinanet-rbox-le90_r18_tiny-dota.py',
    'mmnanguard::_base_/nanguard.py',
]
