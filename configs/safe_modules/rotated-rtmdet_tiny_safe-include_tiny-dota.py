# Rotated RTMDet-tiny with the loss the upstream config has,
# RotatedIoULoss(mode='linear'), whose mmcv 2.0.1 kernel runs on CUDA
# only, and the safe-modules include: it becomes SafeRotatedIoULoss (plain
# PyTorch, same arguments), so the upstream loss trains on the CPU.
_base_ = [
    '../tiny/rotated-rtmdet_tiny_tiny-dota.py',
    'mmnanguard::_base_/safe_modules.py',
]

model = dict(
    bbox_head=dict(
        loss_bbox=dict(
            _delete_=True,
            type='RotatedIoULoss',
            mode='linear',
            loss_weight=2.0,
        )
    )
)
