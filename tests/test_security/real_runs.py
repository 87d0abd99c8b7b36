# Copyright (c) mmnanguard contributors. All rights reserved.
"""What the security tests expect of the session's real runs
(``tests/family_runs.py``): each trains a family's tiny config with the
``mmnanguard`` include for 2 iterations with an ``inf`` loss planted at
iteration 1, and leaves a real mmengine checkpoint (``iter_2.pth``) and a
real incident folder (with ``batch.pth``, ``report.json``, ``config.py``
and ``model.pth``).
"""

#: family (of tests/family_runs.py) -> the data classes its batch.pth holds
FAMILIES = {
    'rotated_retinanet_dota': {
        'DetDataSample',
        'InstanceData',
        'RotatedBoxes',
    },
    'retinanet_coco': {'DetDataSample', 'InstanceData', 'HorizontalBoxes'},
    'fcn_cityscapes': {'SegDataSample', 'PixelData'},
    'rotated_rtmdet_ema_dota': {
        'DetDataSample',
        'InstanceData',
        'RotatedBoxes',
    },
    'mask_rcnn_coco': {
        'DetDataSample',
        'InstanceData',
        'HorizontalBoxes',
        'BitmapMasks',
    },
}
#: The families whose checkpoints are resumed (a Mask R-CNN checkpoint
#: holds what the others hold; its batch adds the masks).
RESUMED = (
    'rotated_retinanet_dota',
    'retinanet_coco',
    'fcn_cityscapes',
    'rotated_rtmdet_ema_dota',
)
#: What a real mmengine checkpoint references beyond torch's defaults.
CHECKPOINT_GLOBALS = {
    'builtins.getattr',
    'mmengine.logging.history_buffer.HistoryBuffer',
    'numpy._core.multiarray._reconstruct',
    'numpy._core.multiarray.scalar',
    'numpy.dtype',
    'numpy.ndarray',
}
