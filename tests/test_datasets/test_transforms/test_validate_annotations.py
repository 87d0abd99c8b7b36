# Copyright (c) mmnanguard contributors. All rights reserved.
"""ValidateAnnotations: every check and policy on real pipelines built from
the tiny mmrotate (DOTA), mmdet (COCO) and mmseg (Cityscapes) configs."""

import copy
import json
import math
import os
import os.path as osp
import re

import cv2
import numpy as np
import pytest
from mmengine.logging import MMLogger
from mmengine.registry import DATASETS, TRANSFORMS, init_default_scope

from mmnanguard.datagen import (
    BROKEN_KINDS,
    DOTA_CLASSES,
    generate_cityscapes,
    generate_coco,
    generate_dota,
)
from mmnanguard.datasets import (
    InvalidAnnotationError,
    ValidateAnnotations,
    checks,
)
from mmnanguard.testing import (
    TINY_COCO_CONFIG,
    TINY_DOTA_CONFIG,
    load_tiny_config,
)

TINY_CITYSCAPES_CONFIG = osp.join(
    osp.dirname(TINY_DOTA_CONFIG), 'fcn_r18-d8_tiny-cityscapes.py'
)
LOADABLE_KINDS = tuple(k for k in BROKEN_KINDS if k != 'unknown_class')


# --------------------------------------------------------------- helpers
def build_dataset(config, root, tmp_path, pipeline, **dataset_overrides):
    cfg = load_tiny_config(config, str(tmp_path / 'work'), root)
    init_default_scope(cfg.default_scope)
    ds_cfg = copy.deepcopy(cfg.train_dataloader.dataset)
    ds_cfg.pipeline = pipeline
    ds_cfg.update(dataset_overrides)
    return DATASETS.build(ds_cfg)


def config_pipeline(config, tmp_path):
    cfg = load_tiny_config(config, str(tmp_path / 'work'), str(tmp_path))
    return copy.deepcopy(cfg.train_pipeline)


def insert(pipeline, at, **validate):
    """The config's pipeline with ValidateAnnotations inserted at ``at``."""
    out = list(pipeline)
    out.insert(at, dict(type='ValidateAnnotations', **validate))
    return out


def index_of(dataset, file_name):
    for idx in range(len(dataset)):
        if osp.basename(dataset.get_data_info(idx)['img_path']) == file_name:
            return idx
    raise KeyError(file_name)


def validate_transform(dataset):
    found = [
        t
        for t in dataset.pipeline.transforms
        if isinstance(t, ValidateAnnotations)
    ]
    assert len(found) == 1
    return found[0]


def failed_checks(message):
    return set(re.findall(r'(\w+) failed for', message))


def annfile_lines(path):
    with open(path) as f:
        return [line.split() for line in f.read().splitlines()]


@pytest.fixture(scope='module')
def broken_dota(tmp_path_factory):
    """8 images; image k holds planted kind k on line 2 (loadable kinds)."""
    root = str(tmp_path_factory.mktemp('broken_dota'))
    written = generate_dota(root, num_images=8, seed=0, broken=LOADABLE_KINDS)
    return root, {b['kind']: b for b in written['broken']}


@pytest.fixture
def log_file(tmp_path):
    """A current MMLogger writing to a file, as the runner's logger does."""
    path = str(tmp_path / 'run.log')
    MMLogger.get_instance(f'nanguard_test_{id(path)}', log_file=path)
    return path


# ------------------------------------------------------ pure check values
@pytest.mark.parametrize('bad', [math.nan, math.inf, -math.inf])
def test_check_hboxes_non_finite(bad):
    boxes = np.array([[0, 0, 10, 10], [bad, 0, 10, 10], [0, 0, 10, 10.5]])
    found = checks.check_hboxes(boxes, min_size=1.0)
    assert [(v.check, v.index) for v in found] == [('hbox_finite', 1)]


def test_check_hboxes_size_hand_values():
    # widths 10, 1.0 (not > 1), 0.5; heights 10, 5, 10
    boxes = np.array([[0, 0, 10, 10], [2, 0, 3, 5], [4, 0, 4.5, 10]])
    found = checks.check_hboxes(boxes, min_size=1.0)
    assert [(v.check, v.index) for v in found] == [
        ('hbox_size', 1),
        ('hbox_size', 2),
    ]
    assert found[1].values == (4.0, 0.0, 4.5, 10.0)
    assert 'w=0.5' in found[1].detail


PI = math.pi


@pytest.mark.parametrize(
    'version,w,h,angle,ok',
    [
        # le90: long side vertical <=> regularized angle on -pi/2 == pi/2
        ('le90', 20, 10, -PI / 2, False),
        ('le90', 20, 10, PI / 2, False),
        ('le90', 20, 10, float(np.float32(-PI / 2)), False),
        ('le90', 20, 10, 3 * PI / 2, False),
        ('le90', 10, 20, 0.0, False),
        ('le90', 10, 20, -PI / 2, True),  # = (20, 10, 0)
        ('le90', 20, 10, -PI / 2 + 1e-3, True),
        ('le90', 20, 10, 0.0, True),
        ('le90', 20, 10, 2.0, True),  # = (20, 10, 2 - pi)
        ('le90', 20, 20, 0.0, False),  # square: (20, 20, pi/2)
        ('le135', 20, 10, -PI / 4, False),
        ('le135', 20, 10, 3 * PI / 4, False),
        ('le135', 20, 10, -PI / 2, True),  # = (20, 10, pi/2)
        ('oc', 20, 10, -PI / 4, True),
        ('oc', 20, 10, 0.0, False),
        ('oc', 20, 10, -PI / 2, False),
    ],
)
def test_check_rboxes_angle(version, w, h, angle, ok):
    boxes = np.array([[50.0, 50.0, w, h, angle]])
    found = checks.check_rboxes(boxes, 1.0, angle_version=version)
    assert [v.check for v in found] == ([] if ok else ['rbox_angle'])


@pytest.mark.parametrize('version', ['oc', 'le90', 'le135'])
def test_regularize_matches_mmrotate(version):
    """The float64 regularization equals mmrotate's regularize_boxes."""
    import torch
    from mmrotate.structures.bbox import RotatedBoxes

    rng = np.random.default_rng(0)
    boxes = np.concatenate(
        [
            rng.uniform(0, 100, (200, 2)),
            rng.uniform(1, 50, (200, 2)),
            rng.uniform(-2 * PI, 2 * PI, (200, 1)),
        ],
        axis=1,
    )
    expected = RotatedBoxes(torch.from_numpy(boxes), dtype=torch.float64)
    expected = expected.regularize_boxes(version)[:, 2:].numpy()
    ours = checks.regularize_rboxes(boxes, version)
    np.testing.assert_allclose(ours, expected, rtol=1e-12, atol=1e-12)


def test_check_rboxes_size_and_finite():
    boxes = np.array(
        [
            [5.0, 5.0, 0.0, 30.0, 0.1],
            [5.0, 5.0, 30.0, 1.0, 0.1],
            [math.nan, 5.0, 3.0, 3.0, 0.1],
            [5.0, 5.0, 3.0, 3.0, 0.1],
            # what ConvertBoxType makes of a NaN corner: only non-finite
            [math.nan, math.nan, 0.0, 0.0, 0.0],
            [5.0, 5.0, 3.0, 3.0, math.inf],
        ]
    )
    found = checks.check_rboxes(boxes, 1.0, angle_version='le90')
    assert [(v.check, v.index) for v in found] == [
        ('rbox_finite', 2),
        ('rbox_finite', 4),
        ('rbox_finite', 5),
        ('rbox_size', 0),
        ('rbox_size', 1),
    ]


def test_check_qboxes_area_matches_shoelace_float64():
    quads = np.array(
        [
            [0, 0, 4, 0, 4, 3, 0, 3],  # rectangle 12
            [0, 0, 10, 10, 20, 20, 30, 30],  # collinear: 0
            [0, 0, 10, 10, 10, 0, 0, 10],  # bow tie: 0
            [0, 0, 1, 0, 1, 0.9, 0, 0.9],  # 0.9 < 1**2
        ],
        dtype=np.float64,
    )
    np.testing.assert_allclose(checks.quad_areas(quads), [12, 0, 0, 0.9])
    found = checks.check_qboxes(quads, min_size=1.0)
    assert [(v.check, v.index) for v in found] == [
        ('qbox_area', 1),
        ('qbox_area', 2),
        ('qbox_area', 3),
    ]
    quads[0, 3] = math.inf
    assert checks.check_qboxes(quads[:1], 1.0)[0].check == 'qbox_finite'


def test_check_labels_and_seg_values_counts():
    found = checks.check_labels(np.array([0, 14, 15, -1]), num_classes=15)
    assert [(v.index, v.values) for v in found] == [(2, (15,)), (3, (-1,))]
    seg = np.zeros((10, 10), np.uint8)
    seg[0, :3] = 255
    seg[1, :4] = 19
    seg[2, :5] = 34
    (v,) = checks.check_seg_map(seg, num_classes=19, ignore_index=255)
    assert v.values == (19, 34)
    assert '19: 4 px' in v.detail and '34: 5 px' in v.detail
    assert checks.check_seg_map(seg.astype(np.int64), 35, 255) == []


@pytest.mark.parametrize('bad', [math.nan, math.inf, -math.inf])
def test_check_image_counts(bad):
    img = np.zeros((4, 5, 3), np.float32)
    img[0, 0, 0] = bad
    img[1, 1, 1] = bad
    (v,) = checks.check_image(img)
    expected = {'nan': (2, 0, 0), 'inf': (0, 2, 0), '-inf': (0, 0, 2)}[
        str(bad)
    ]
    assert v.values == expected
    assert checks.check_image(np.zeros((4, 5, 3), np.uint8)) == []


@pytest.mark.parametrize(
    'value, flagged',
    [
        (-3.4e38, True),  # GDAL's float32 NoData value
        (float(np.finfo(np.float32).max), True),
        (1.9e19, True),  # its square passes float32
        (1.8e19, False),
        (65535.0, False),  # a uint16 image read as float
        (-1e4, False),
    ],
)
def test_check_image_range_names_extreme_finite_pixels(value, flagged):
    img = np.random.default_rng(0).random((6, 7, 3)).astype(np.float32)
    img[:2, :3] = value  # 18 pixels
    found = checks.check_image(img)
    if not flagged:
        assert found == []
        return
    (v,) = found
    assert v.check == 'image_range' and v.index is None
    # independent: numpy in float64
    big = np.abs(img.astype(np.float64)) >= math.sqrt(
        float(np.finfo(np.float32).max)
    )
    assert v.values == (int(big.sum()), float(np.float32(value)))
    assert v.values[0] == 18


def test_a_non_finite_pixel_is_told_before_extreme_ones():
    img = np.zeros((2, 2), np.float32)
    img[0, 0] = -3.4e38
    img[1, 1] = math.nan
    (v,) = checks.check_image(img)
    assert v.check == 'image_finite' and v.values == (1, 0, 0)


def test_empty_inputs():
    assert checks.check_boxes(np.zeros((0, 5)), 1.0, 'le90') == []
    assert checks.check_labels(np.zeros((0,), np.int64), 3) == []


def test_invalid_arguments():
    with pytest.raises(ValueError, match='policy'):
        ValidateAnnotations(num_classes=3, policy='drop')
    with pytest.raises(ValueError, match='angle_version'):
        checks.check_rboxes(np.zeros((1, 5)), 1.0, angle_version='le45')


def test_registered_for_every_scope():
    for scope in ('mmdet', 'mmrotate', 'mmseg'):
        init_default_scope(scope)
        t = TRANSFORMS.build(dict(type='ValidateAnnotations', num_classes=3))
        assert isinstance(t, ValidateAnnotations)


# ------------------------------------------------- mmrotate (DOTA) checks
# (kind, where ValidateAnnotations goes, extra pipeline edits, checks)
DOTA_CASES = [
    ('zero_width', 'end', {}, {'rbox_size'}),
    ('collapsed_quad', 'after_load', {}, {'qbox_area'}),
    ('collapsed_quad', 'end', {}, {'rbox_size'}),
    ('nan_coordinate', 'after_load', {}, {'qbox_finite'}),
    ('nan_coordinate', 'end', {}, {'rbox_finite'}),
    ('nan_coordinate', 'end', {'hbox': True}, {'hbox_finite'}),
    ('angle_pi_2', 'end', {}, {'rbox_angle'}),
    (
        'negative_coordinate',
        'after_convert',
        {'negative_coords': True},
        {'negative_coord'},
    ),
]


def dota_pipeline(tmp_path, where, hbox=False, **validate):
    pipeline = config_pipeline(TINY_DOTA_CONFIG, tmp_path)
    if hbox:  # the hbox variant: quadrilaterals converted to hboxes
        pipeline[2] = dict(
            type='ConvertBoxType', box_type_mapping=dict(gt_bboxes='hbox')
        )
    at = dict(after_load=2, after_convert=3, end=len(pipeline) - 1)[where]
    return insert(
        pipeline,
        at,
        num_classes=15,
        angle_version='le90',
        policy='raise',
        **validate,
    )


@pytest.mark.parametrize('kind,where,edit,expected', DOTA_CASES)
def test_dota_checks_raise_with_file_instance_values(
    broken_dota, tmp_path, kind, where, edit, expected
):
    root, planted = broken_dota
    dataset = build_dataset(
        TINY_DOTA_CONFIG,
        root,
        tmp_path,
        dota_pipeline(tmp_path, where, **edit),
    )
    bad_image = osp.basename(planted[kind]['image'])
    planted_images = {osp.basename(b['image']) for b in planted.values()}
    for idx in range(len(dataset)):  # the clean images pass
        name = osp.basename(dataset.get_data_info(idx)['img_path'])
        if name not in planted_images:
            dataset[idx]
    with pytest.raises(InvalidAnnotationError) as err:
        dataset[index_of(dataset, bad_image)]
    message = str(err.value)
    assert bad_image in message
    assert failed_checks(message) == expected
    # the planted line is line 2, i.e. instance 1
    assert all(f'{c} failed for instance 1' in message for c in expected)
    if kind == 'nan_coordinate' and where == 'after_load':
        raw = annfile_lines(planted[kind]['annfile'])[1][:8]
        values = ', '.join(f'{float(np.float32(v)):.6g}' for v in raw)
        assert f'qbox_finite failed for instance 1: ({values})' in message


def test_dota_unknown_class_crashes_upstream_loader(tmp_path):
    """Upstream behaviour this package reports around: DOTADataset raises
    a KeyError for a class outside the vocabulary, at construction."""
    root = str(tmp_path / 'dota')
    generate_dota(root, num_images=2, broken=('unknown_class',))
    with pytest.raises(KeyError, match='flying-saucer'):
        build_dataset(TINY_DOTA_CONFIG, root, tmp_path, [])


def test_dota_label_range_against_model_classes(tiny_dota_root, tmp_path):
    """A model with 3 classes on the 15-class DOTA set: labels >= 3 fail;
    filter keeps exactly the instances whose class index is < 3."""
    pipeline = config_pipeline(TINY_DOTA_CONFIG, tmp_path)
    pipeline = insert(pipeline, len(pipeline) - 1, num_classes=3)
    dataset = build_dataset(
        TINY_DOTA_CONFIG, tiny_dota_root, tmp_path, pipeline
    )
    total_dropped = 0
    for idx in range(len(dataset)):
        info = dataset.get_data_info(idx)
        ann = info['img_path'].replace('images', 'annfiles')[:-4] + '.txt'
        labels = [DOTA_CLASSES.index(f[8]) for f in annfile_lines(ann)]
        sample = dataset[idx]
        kept = sample['data_samples'].gt_instances.labels.tolist()
        assert kept == [lb for lb in labels if lb < 3]
        total_dropped += sum(lb >= 3 for lb in labels)
    assert total_dropped > 0
    assert validate_transform(dataset).num_dropped_instances == total_dropped


def test_dota_policy_filter_keeps_labels_and_ignore_flags_aligned(
    broken_dota, tmp_path, log_file
):
    root, planted = broken_dota
    # line 1 of every annfile becomes difficult (ignored with diff_thr=0)
    work = str(tmp_path / 'dota')
    generate_dota(work, num_images=8, seed=0, broken=LOADABLE_KINDS)
    for info in planted.values():
        path = info['annfile'].replace(root, work)
        lines = annfile_lines(path)
        lines[0][9] = '1'
        with open(path, 'w') as f:
            f.write('\n'.join(' '.join(x) for x in lines) + '\n')
    pipeline = dota_pipeline(tmp_path, 'end')
    pipeline[-2]['policy'] = 'filter'
    dataset = build_dataset(
        TINY_DOTA_CONFIG, work, tmp_path, pipeline, diff_thr=0
    )
    dropped_kinds = {
        'zero_width',
        'collapsed_quad',
        'nan_coordinate',
        'angle_pi_2',
    }
    for kind in LOADABLE_KINDS:
        path = planted[kind]['annfile'].replace(root, work)
        lines = annfile_lines(path)
        sample = dataset[
            index_of(dataset, osp.basename(planted[kind]['image']))
        ]
        gt = sample['data_samples'].gt_instances
        ignored = sample['data_samples'].ignored_instances
        keep = [
            i
            for i in range(1, len(lines))
            if not (i == 1 and kind in dropped_kinds)
        ]
        expected = [DOTA_CLASSES.index(lines[i][8]) for i in keep]
        assert gt.labels.tolist() == expected
        assert ignored.labels.tolist() == [DOTA_CLASSES.index(lines[0][8])]
        # box sides equal cv2.minAreaRect of the kept lines (flip-invariant)
        sides = [
            sorted(
                cv2.minAreaRect(
                    np.array(lines[i][:8], np.float32).reshape(4, 2)
                )[1]
            )
            for i in keep
        ]
        np.testing.assert_allclose(
            np.sort(gt.bboxes.tensor[:, 2:4].numpy(), axis=1), sides, rtol=1e-5
        )
    transform = validate_transform(dataset)
    assert transform.num_dropped_instances == len(dropped_kinds)
    with open(log_file) as f:
        log = f.read()
    assert log.count(
        'ValidateAnnotations(policy=filter): dropped 1 '
        'invalid instance(s) [1]'
    ) == len(dropped_kinds)
    assert 'nanguard_invalid_instances=4' in log


def test_dota_policy_warn_logs_and_keeps(broken_dota, tmp_path, log_file):
    root, planted = broken_dota
    pipeline = dota_pipeline(tmp_path, 'end')
    pipeline[-2]['policy'] = 'warn'
    dataset = build_dataset(TINY_DOTA_CONFIG, root, tmp_path, pipeline)
    info = planted['zero_width']
    sample = dataset[index_of(dataset, osp.basename(info['image']))]
    labels = [DOTA_CLASSES.index(f[8]) for f in annfile_lines(info['annfile'])]
    assert sample['data_samples'].gt_instances.labels.tolist() == labels
    with open(log_file) as f:
        log = f.read()
    assert 'ValidateAnnotations(policy=warn): kept' in log
    assert osp.basename(info['image']) in log
    assert 'rbox_size failed for instance 1' in log
    assert validate_transform(dataset).num_dropped_instances == 0


# ------------------------------------------------------ mmdet (COCO) checks
@pytest.fixture(scope='module')
def coco_with_edge_box(tmp_path_factory):
    """COCO set with polygon masks; image 0 gets a 3.5 px wide box on the
    left edge (a crop can cut it into a sliver) and 12 px boxes in the four
    corners (a rotation can push them almost out of the image)."""
    root = str(tmp_path_factory.mktemp('coco_edge'))
    written = generate_coco(root, num_images=2, seed=0)
    with open(written['ann_file']) as f:
        coco = json.load(f)
    extra = [[0.0, 100.0, 3.5, 40.0]] + [
        [x, y, 12.0, 12.0] for x in (0.0, 244.0) for y in (0.0, 244.0)
    ]
    for bbox in extra:
        coco['annotations'].append(
            dict(
                id=len(coco['annotations']) + 1,
                image_id=1,
                category_id=2,
                bbox=bbox,
                area=bbox[2] * bbox[3],
                iscrowd=0,
            )
        )
    for ann in coco['annotations']:
        x, y, w, h = ann['bbox']
        ann['segmentation'] = [[x, y, x + w, y, x + w, y + h, x, y + h]]
    with open(written['ann_file'], 'w') as f:
        json.dump(coco, f)
    return root


AUGMENTATIONS = {
    # mmdet: crop 250 x 256 out of 256 x 256
    'RandomCrop': dict(type='RandomCrop', crop_size=(250, 256)),
    # mmrotate: rotate by up to +-10 degrees, boxes clipped to the image
    'RandomRotate': dict(
        type='mmrotate.RandomRotate',
        prob=1.0,
        angle_range=10,
        rotate_type='mmrotate.Rotate',
    ),
}


def coco_aug_pipeline(tmp_path, augmentation, validate=None):
    """The tiny COCO config's pipeline with masks, ``augmentation`` after
    its Resize (a no-op on 256 px images) and its flip disabled."""
    pipeline = config_pipeline(TINY_COCO_CONFIG, tmp_path)
    pipeline[1] = dict(
        type='LoadAnnotations', with_bbox=True, with_mask=True, poly2mask=False
    )
    pipeline[3] = dict(type='RandomFlip', prob=0.0)
    pipeline.insert(3, AUGMENTATIONS[augmentation])
    if validate is not None:
        pipeline = insert(pipeline, len(pipeline) - 1, **validate)
    return pipeline


def sliver_indices(boxes, min_size):
    boxes = boxes.astype(np.float64)
    sides = np.minimum(boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1])
    return np.flatnonzero((sides > 0) & (sides <= min_size))


@pytest.mark.parametrize('augmentation', sorted(AUGMENTATIONS))
def test_coco_augmentation_degenerate_box_filtered_with_masks(
    coco_with_edge_box, tmp_path, log_file, augmentation
):
    """The augmentation turns boxes into slivers (<= min_size=2 px, kept by
    the augmentation itself); filter drops exactly those, with their labels
    and masks, and leaves everything else as the plain pipeline made it."""
    plain = build_dataset(
        TINY_COCO_CONFIG,
        coco_with_edge_box,
        tmp_path,
        coco_aug_pipeline(tmp_path, augmentation),
    )
    seed = None
    for candidate in range(60):
        np.random.seed(candidate)
        gt = plain[0]['data_samples'].gt_instances
        sliver = sliver_indices(gt.bboxes.tensor.numpy(), 2.0)
        if len(sliver):
            seed, reference = candidate, gt
            break
    assert seed is not None, f'no seed made a sliver with {augmentation}'

    dataset = build_dataset(
        TINY_COCO_CONFIG,
        coco_with_edge_box,
        tmp_path,
        coco_aug_pipeline(
            tmp_path, augmentation, dict(num_classes=3, min_size=2.0)
        ),
    )
    np.random.seed(seed)
    gt = dataset[0]['data_samples'].gt_instances
    keep = np.setdiff1d(np.arange(len(reference)), sliver)
    np.testing.assert_array_equal(
        gt.labels.numpy(), reference.labels.numpy()[keep]
    )
    np.testing.assert_allclose(
        gt.bboxes.tensor.numpy(), reference.bboxes.tensor.numpy()[keep]
    )
    # the masks stay aligned: the kept instances keep their own polygons
    assert len(gt.masks) == len(keep)
    for ours, ref in zip(
        gt.masks.masks, [reference.masks.masks[i] for i in keep]
    ):
        np.testing.assert_array_equal(
            np.concatenate(ours), np.concatenate(ref)
        )
    if augmentation == 'RandomCrop':  # and each polygon encloses its box
        np.testing.assert_allclose(
            gt.masks.get_bboxes('hbox').tensor.numpy(),
            gt.bboxes.tensor.numpy(),
            atol=1e-3,
        )
    assert len(sliver_indices(gt.bboxes.tensor.numpy(), 2.0)) == 0
    transform = validate_transform(dataset)
    assert transform.num_dropped_instances == len(sliver)
    with open(log_file) as f:
        log = f.read()
    assert (
        f'dropped {len(sliver)} invalid instance(s) {sliver.tolist()}' in log
    )


@pytest.mark.parametrize(
    'value, told',
    [
        (np.nan, 'image_finite failed for sample: (6, 0, 0)'),
        # GDAL's NoData value: finite, but BatchNorm's variance overflows
        (-3.4e38, 'image_range failed for sample: (6, -3.4e+38)'),
    ],
)
def test_coco_non_finite_image(tmp_path, log_file, value, told):
    """A float TIFF with NaN or NoData pixels: raise names the file and
    the counts; filter drops the sample and the dataset refetches
    another."""
    root = str(tmp_path / 'coco')
    written = generate_coco(root, num_images=2, seed=0)
    img = cv2.imread(osp.join(written['img_dir'], '000000.png'))
    img = img.astype(np.float32)
    img[:2, :3, 0] = value
    cv2.imwrite(osp.join(written['img_dir'], '000000.tiff'), img)
    with open(written['ann_file']) as f:
        coco = json.load(f)
    coco['images'][0]['file_name'] = '000000.tiff'
    with open(written['ann_file'], 'w') as f:
        json.dump(coco, f)
    pipeline = config_pipeline(TINY_COCO_CONFIG, tmp_path)
    pipeline[0] = dict(type='LoadImageFromFile', color_type='unchanged')
    for policy in ('raise', 'filter'):
        dataset = build_dataset(
            TINY_COCO_CONFIG,
            root,
            tmp_path,
            insert(pipeline, 2, num_classes=3, policy=policy),
        )
        if policy == 'raise':
            with pytest.raises(InvalidAnnotationError) as err:
                dataset[0]
            assert '000000.tiff' in str(err.value)
            assert told in str(err.value)
        else:
            sample = dataset[0]
            assert sample['data_samples'].img_path.endswith('000001.png')
            # index 0 is dropped each time the refetch draws it again
            assert validate_transform(dataset).num_dropped_samples >= 1


# --------------------------------------------------- mmseg (Cityscapes)
@pytest.fixture(scope='module')
def stray_cityscapes(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('cityscapes_stray'))
    written = generate_cityscapes(root, num_images=4, stray_values=(19, 34))
    return root, written


def city_index(dataset, seg_map):
    for idx in range(len(dataset)):
        if dataset.get_data_info(idx)['seg_map_path'] == seg_map:
            return idx
    raise KeyError(seg_map)


def test_cityscapes_seg_values_raise(stray_cityscapes, tmp_path):
    root, written = stray_cityscapes
    pipeline = config_pipeline(TINY_CITYSCAPES_CONFIG, tmp_path)
    # right after LoadAnnotations: a random crop could cut the stray away
    dataset = build_dataset(
        TINY_CITYSCAPES_CONFIG,
        root,
        tmp_path,
        insert(pipeline, 2, num_classes=19, policy='raise'),
    )
    stray = {s['seg_map']: s for s in written['stray']}
    for idx in range(len(dataset)):
        seg_map = dataset.get_data_info(idx)['seg_map_path']
        if seg_map not in stray:
            dataset[idx]  # 255 regions are fine
            continue
        with pytest.raises(InvalidAnnotationError) as err:
            dataset[idx]
        assert osp.basename(seg_map) in str(err.value)
        assert (
            f"seg_values failed for sample: ({stray[seg_map]['value']})"
            in str(err.value)
        )


def test_cityscapes_seg_values_filter_and_warn(
    stray_cityscapes, tmp_path, log_file
):
    root, written = stray_cityscapes
    pipeline = config_pipeline(TINY_CITYSCAPES_CONFIG, tmp_path)
    for policy in ('filter', 'warn'):
        # loading-only: pixel counts are exactly the planted ones
        dataset = build_dataset(
            TINY_CITYSCAPES_CONFIG,
            root,
            tmp_path,
            pipeline[:2]
            + [
                dict(type='ValidateAnnotations', num_classes=19, policy=policy)
            ],
        )
        for info in written['stray']:
            out = dataset[city_index(dataset, info['seg_map'])]
            raw = cv2.imread(info['seg_map'], cv2.IMREAD_UNCHANGED)
            if policy == 'filter':
                expected = np.where(raw == info['value'], 255, raw)
            else:
                expected = raw
            np.testing.assert_array_equal(out['gt_seg_map'], expected)
        transform = validate_transform(dataset)
        masked = sum(s['pixels'] for s in written['stray'])
        assert transform.num_masked_pixels == (
            masked if policy == 'filter' else 0
        )
    with open(log_file) as f:
        log = f.read()
    assert f'nanguard_masked_pixels={masked}' in log
    assert 'ValidateAnnotations(policy=warn): kept' in log
    # the full real pipeline (resize, crop, flip) then yields clean maps
    dataset = build_dataset(
        TINY_CITYSCAPES_CONFIG,
        root,
        tmp_path,
        insert(pipeline, len(pipeline) - 1, num_classes=19),
    )
    for idx in range(len(dataset)):
        seg = dataset[idx]['data_samples'].gt_sem_seg.data.numpy()
        assert set(np.unique(seg)) <= set(range(19)) | {255}


# ---------------------------------------------- the count in a real run
def test_without_the_transform_zero_width_gives_inf_loss(tmp_path):
    """The contrast case of the next test: the same run without
    ValidateAnnotations has an infinite box loss (log of a zero width)."""
    from mmengine.runner import Runner

    root = str(tmp_path / 'dota')
    generate_dota(root, num_images=4, seed=0, broken=('zero_width',) * 4)
    cfg = load_tiny_config(
        TINY_DOTA_CONFIG, str(tmp_path / 'work'), root, max_iters=1
    )
    runner = Runner.from_cfg(cfg)
    runner.train()
    (loss_bbox,) = runner.message_hub.get_scalar('train/loss_bbox').data[0]
    assert loss_bbox == math.inf


@pytest.mark.parametrize('num_workers', [0, 2])
def test_filter_counts_reach_the_training_log(tmp_path, num_workers):
    """Rotated RetinaNet trains 2 iterations on a DOTA set where every
    image has a zero-width box; the mmengine text log of the run names each
    dropped instance and the running count, also from (forked) dataloader
    workers, and the losses stay finite."""
    from mmengine.runner import Runner

    root = str(tmp_path / 'dota')
    generate_dota(root, num_images=4, seed=0, broken=('zero_width',) * 4)
    cfg = load_tiny_config(
        TINY_DOTA_CONFIG, str(tmp_path / 'work'), root, max_iters=2
    )
    pipeline = insert(
        cfg.train_pipeline,
        len(cfg.train_pipeline) - 1,
        num_classes=15,
        angle_version='le90',
    )
    cfg.train_dataloader.dataset.pipeline = pipeline
    cfg.train_dataloader.num_workers = num_workers
    runner = Runner.from_cfg(cfg)
    runner.train()
    losses, _ = runner.message_hub.get_scalar('train/loss').data
    assert len(losses) == 2 and np.isfinite(losses).all()
    (log_path,) = [
        osp.join(runner.log_dir, f)
        for f in os.listdir(runner.log_dir)
        if f.endswith('.log')
    ]
    with open(log_path) as f:
        log = f.read()
    drops = log.count(
        'ValidateAnnotations(policy=filter): dropped 1 invalid instance(s) [1]'
    )
    assert 'rbox_size failed for instance 1' in log
    if num_workers == 0:
        # 2 iterations x batch 2 = 4 samples, one zero-width box each
        assert drops == 4
        assert 'nanguard_invalid_instances=4' in log
    else:
        # each worker counts its own samples; workers may prefetch more
        assert drops >= 4
        assert 'nanguard_invalid_instances=2' in log
