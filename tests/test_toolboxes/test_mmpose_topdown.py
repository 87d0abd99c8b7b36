# Copyright (c) mmnanguard contributors. All rights reserved.
"""mmpose's top-down heatmap config (``td-hm_res50``, ResNet + HeatmapHead
+ ``KeypointMSELoss``) through the include, on generated COCO person
keypoints, with a NaN gradient planted at iteration 1."""

import pytest
from stack_marks import needs_mmpose
from toolbox_runs import check_protected_run, train_protected, upstream_config

pytestmark = [pytest.mark.stack_smoke, needs_mmpose]

TOPDOWN = (
    'body_2d_keypoint/topdown_heatmap/coco/'
    'td-hm_res50_8xb64-210e_coco-256x192.py'
)
#: 64x64 crops, 16x16 heatmaps: ResNet's stride 32 and the head's three
#: deconvolutions (x8) give 2x2 -> 16x16.
CODEC = dict(
    type='MSRAHeatmap', input_size=(64, 64), heatmap_size=(16, 16), sigma=1
)


def shrink_topdown(data_root):
    """ResNet-18 at a quarter of its widths for ResNet-50, no pretrained
    weights, the small codec everywhere the config uses it."""

    def shrink(cfg):
        model = cfg.model
        model.backbone.update(depth=18, base_channels=16, init_cfg=None)
        model.head.update(
            in_channels=128, deconv_out_channels=(32, 32, 32), decoder=CODEC
        )
        pipeline = cfg.train_dataloader.dataset.pipeline
        for transform in pipeline:
            if transform['type'] == 'TopdownAffine':
                transform['input_size'] = CODEC['input_size']
            if transform['type'] == 'GenerateTarget':
                transform['encoder'] = CODEC
        # PoseVisualizationHook draws nothing in training; it takes no
        # `draw` switch (which shrink_runtime sets on mmdet's)
        cfg.default_hooks.pop('visualization')
        cfg.train_dataloader.dataset.update(
            data_root=data_root,
            ann_file='annotations/person_keypoints.json',
            data_prefix=dict(img='images/'),
        )

    return shrink


def test_topdown_heatmap_protected(tmp_path, tiny_keypoints_root):
    run = train_protected(
        tmp_path,
        upstream_config('mmpose', TOPDOWN),
        shrink_topdown(tiny_keypoints_root),
    )
    check_protected_run(run)
