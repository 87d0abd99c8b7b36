# The README main job (`make demo`, tools/demo.py): mmrotate's rotated
# RetinaNet (unmodified upstream config, shrunk for the CPU) with
# mmnanguard's protection added by one `_base_` entry, and one injected
# numerical fault: a NaN gradient at iteration 6 (0-based). The broken
# annotation comes from the generated data (tools/demo.py plants it).
# FaultInjectionHook is a test/drill helper, registered only by importing
# mmnanguard.testing (`import mmnanguard` leaves it out).
_base_ = [
    '../tiny/rotated-retinanet-rbox-le90_r18_tiny-dota.py',
    'mmnanguard::_base_/nanguard.py',
]

custom_imports = dict(
    imports=['mmnanguard.testing'], allow_failed_imports=False
)
custom_hooks = [dict(type='FaultInjectionHook', fault='nan_grad', iteration=6)]
