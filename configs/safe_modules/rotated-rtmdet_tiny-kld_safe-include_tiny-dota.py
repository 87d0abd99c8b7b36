# Rotated RTMDet-tiny with mmrotate's GDLoss(loss_type='kld'), which goes
# NaN by itself within the first iterations on generated DOTA data, with
# the safe-modules include: GDLoss becomes SafeGDLoss (same arguments) and
# training stays finite. One added `_base_` entry.
_base_ = [
    '../tiny/rotated-rtmdet_tiny-kld_tiny-dota.py',
    'mmnanguard::_base_/safe_modules.py',
]
