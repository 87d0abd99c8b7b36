# Copyright (c) mmnanguard contributors. All rights reserved.
"""mmpretrain's ResNet-18 and DeiT-tiny ImageNet configs through the
include, on a generated ImageFolder set, with a NaN gradient planted at
iteration 1. DeiT's ``paramwise_cfg`` gives every parameter its own param
group (the lr of each is checked in the history), its ``clip_grad`` makes
the guard read the clipped norm, and Mixup/CutMix turn the labels into
scores."""

import pytest
from stack_marks import needs_mmpretrain
from toolbox_runs import check_protected_run, train_protected, upstream_config

from mmnanguard.datagen import IMAGE_FOLDER_CLASSES

pytestmark = [pytest.mark.stack_smoke, needs_mmpretrain]

SIDE = 32


def use_image_folder(cfg, folder):
    """The generated set, read by ``CustomDataset`` from its class folders,
    with the config's own training pipeline cropped to 32x32."""
    cfg.model.head.num_classes = len(IMAGE_FOLDER_CLASSES)
    cfg.data_preprocessor.num_classes = len(IMAGE_FOLDER_CLASSES)
    pipeline = cfg.train_dataloader.dataset.pipeline
    for transform in pipeline:
        if transform['type'] == 'RandomResizedCrop':
            transform['scale'] = SIDE
    cfg.train_dataloader.dataset = dict(
        type='CustomDataset',
        data_prefix=folder['data_prefix'],
        with_label=True,
        pipeline=pipeline,
    )


def shrink_resnet(cfg, folder):
    """ResNet-18 at a quarter of its widths."""
    cfg.model.backbone.base_channels = 16
    cfg.model.head.in_channels = 128
    use_image_folder(cfg, folder)


def shrink_deit(cfg, folder):
    """DeiT-tiny on 32x32 images: 2x2 patches of 16x16; its warmup
    (``LinearLR``, 20 epochs) takes 2 iterations, the cosine decay the
    rest."""
    cfg.model.backbone.img_size = SIDE
    warmup, decay = cfg.param_scheduler
    warmup.update(end=2, convert_to_iter_based=False)
    decay.update(begin=2, convert_to_iter_based=False)
    use_image_folder(cfg, folder)


CONFIGS = [
    ('resnet/resnet18_8xb32_in1k.py', shrink_resnet),
    ('deit/deit-tiny_4xb256_in1k.py', shrink_deit),
]


@pytest.mark.parametrize(
    'config, shrink', CONFIGS, ids=['resnet18', 'deit_tiny']
)
def test_classifier_protected(config, shrink, tmp_path, tiny_image_folder):
    run = train_protected(
        tmp_path,
        upstream_config('mmpretrain', config),
        lambda cfg: shrink(cfg, tiny_image_folder),
    )
    report = check_protected_run(run)
    groups = run['runner'].optim_wrapper.optimizer.param_groups
    assert len(report['history'][-1]['lrs']) == len(groups)


def test_a_label_beyond_num_classes_is_named(tmp_path, tiny_image_folder):
    """The head is given 2 classes, the folder has 3: mmpretrain's own
    ``CrossEntropyLoss`` (found by its values, not its name) refuses label
    2 before the loss runs, naming the value and the module."""
    from mmnanguard.models.losses import InvalidLabelError

    def shrink(cfg):
        shrink_resnet(cfg, tiny_image_folder)
        cfg.model.head.num_classes = 2
        cfg.data_preprocessor.num_classes = 2

    with pytest.raises(InvalidLabelError) as err:
        train_protected(
            tmp_path,
            upstream_config('mmpretrain', CONFIGS[0][0]),
            shrink,
            fault=None,
        )
    message = str(err.value)
    assert 'label value 2 is outside [0, 2)' in message
    assert 'CrossEntropyLoss at model.head.loss_module' in message
