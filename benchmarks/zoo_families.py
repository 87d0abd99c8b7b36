# Copyright (c) mmnanguard contributors. All rights reserved.
"""The upstream model zoo: every config of mmdet, mmrotate and mmseg, by
family, and one representative config per family for the training sweep.

A family is a top-level folder of the package's ``.mim/configs``; files
under a ``_base_`` folder are bases, not configs. The representative is the
config of the family that trains fastest on a CPU and needs nothing that
cannot be had offline, by the rules of :func:`representative_score`
(smallest backbone, the package's main data set, no AMP, no
multi-scale/long-schedule variant), unless :data:`REPRESENTATIVES` names
one by hand (with the reason).
"""

import importlib.util
import os.path as osp
import re
from typing import Callable, Dict, List, Optional, Tuple

PACKAGES = ('mmrotate', 'mmdet', 'mmseg')
#: Package -> its main data set, preferred for the representative.
MAIN_DATASET = dict(mmdet='coco', mmrotate='dota', mmseg='cityscapes')
#: Name parts -> score (higher is preferred), first match of each group.
_PREFER = (
    (r'r18|resnet18', 40),
    (r'_r50|-r50|r50-|resnet50', 30),
    (r'tiny|nano|-t_|_t-|mit-b0|b0|small|_s-|-s_|lite|mobilenet', 25),
    (r'r101|x101|_s50|regnetx-400mf|w18', 10),
)
_AVOID = (
    r'amp|fp16|_ms|-ms|mstrain|ms-|rr-|aug|lsj|crop|[2-9]x|[1-9]\d+e|'
    r'\d+k|-\d{3,}e|coco_pretrain|pretrain|in21k|384|640|1024|1280|'
    r'dcn|gn|sync|large|_l-|-l_|_x-|-x_|huge|base|_m-|-m_'
)
#: The families of ``zoo.py sweep --subset``: every mmrotate family, and
#: of mmdet and mmseg the main detector and segmentor kinds (two-stage,
#: cascade, one-stage anchor-based and anchor-free, YOLO-style with EMA,
#: query-based, instance and panoptic segmentation, RPN-only; encoder-
#: decoder segmentors with auxiliary, list-valued and query-based heads)
#: plus families that need data or packages this machine lacks.
SWEEP_SUBSET = (
    'mmdet/faster_rcnn', 'mmdet/mask_rcnn', 'mmdet/cascade_rcnn',
    'mmdet/retinanet', 'mmdet/fcos', 'mmdet/atss', 'mmdet/gfl',
    'mmdet/tood', 'mmdet/centernet', 'mmdet/yolox', 'mmdet/rtmdet',
    'mmdet/yolo', 'mmdet/ssd', 'mmdet/detr', 'mmdet/deformable_detr',
    'mmdet/dino', 'mmdet/sparse_rcnn', 'mmdet/solov2', 'mmdet/yolact',
    'mmdet/point_rend', 'mmdet/mask2former', 'mmdet/rpn',
    'mmdet/guided_anchoring', 'mmdet/htc', 'mmdet/panoptic_fpn',
    'mmdet/glip', 'mmdet/bytetrack', 'mmdet/soft_teacher',
    'mmseg/fcn', 'mmseg/pspnet', 'mmseg/deeplabv3plus', 'mmseg/ocrnet',
    'mmseg/point_rend', 'mmseg/knet', 'mmseg/upernet', 'mmseg/segformer',
    'mmseg/maskformer', 'mmseg/unet', 'mmseg/bisenetv2', 'mmseg/stdc',
    'mmseg/sem_fpn', 'mmseg/vpd', 'mmseg/poolformer',
)  # fmt: skip
#: Family -> (longest side of the scaled resize target, why), where the
#: package's default (``zoo_cell.TARGET_SIDE``) is too small.
IMG_SIDE: Dict[str, Tuple[int, str]] = {
    'mmseg/mobilenet_v3': (
        2048,
        "the LR-ASPP head's pooling kernel (49) and stride are fixed for "
        '512 x 1024 crops: not shrunk',
    ),
    'mmdet/dino': (
        640,
        'DINO takes its 900 queries from the encoder tokens: fewer than '
        '900 tokens on (square) images under 224 px',
    ),
}
#: Family -> (config, why it is chosen by hand).
REPRESENTATIVES: Dict[str, Tuple[str, str]] = {
    'mmrotate/kld': (
        'mmrotate::kld/rotated-retinanet-rbox-le90_r50_fpn_kld_1x_dota.py',
        'the KLD loss on the plain one-stage detector (R3Det has its own '
        'family)',
    ),
    'mmrotate/kfiou': (
        'mmrotate::kfiou/rotated-retinanet-hbox-le90_r50_fpn_kfiou_1x_'
        'dota.py',
        'the KFIoU loss on the plain one-stage detector (R3Det and S2ANet '
        'have their own families)',
    ),
    'mmrotate/rotated_rtmdet': (
        'mmrotate::rotated_rtmdet/rotated_rtmdet_tiny-3x-dota.py',
        'the smallest variant (tiny)',
    ),
    'mmrotate/roi_trans': (
        'mmrotate::roi_trans/roi-trans-le90_r50_fpn_1x_dota.py',
        "the le90 angle version of the family's main result",
    ),
    'mmdet/centernet': (
        'mmdet::centernet/centernet_r18_8xb16-crop512-140e_coco.py',
        'ResNet-18 upstream',
    ),
    'mmdet/detectors': (
        'mmdet::detectors/cascade-rcnn_r50-sac_1x_coco.py',
        'the HTC variants need COCO-stuff semantic maps',
    ),
    'mmdet/regnet': (
        'mmdet::regnet/retinanet_regnetx-800MF_fpn_1x_coco.py',
        'the smallest RegNet with a 1x schedule',
    ),
    'mmdet/res2net': (
        'mmdet::res2net/faster-rcnn_res2net-101_fpn_2x_coco.py',
        'HTC needs COCO-stuff semantic maps',
    ),
    'mmdet/ssd': (
        'mmdet::ssd/ssdlite_mobilenetv2-scratch_8xb24-600e_coco.py',
        'the smallest variant (MobileNetV2)',
    ),
    'mmdet/dcn': (
        'mmdet::dcn/faster-rcnn_r50-dconv-c3-c5_fpn_1x_coco.py',
        "deformable convolutions in the backbone (the family's point)",
    ),
    'mmdet/dcnv2': (
        'mmdet::dcnv2/faster-rcnn_r50-mdconv-c3-c5_fpn_1x_coco.py',
        'modulated deformable convolutions in the backbone',
    ),
    'mmseg/hrnet': (
        'mmseg::hrnet/fcn_hr18s_4xb2-40k_cityscapes-512x1024.py',
        'the smallest HRNet (18-small) on Cityscapes',
    ),
    'mmseg/segmenter': (
        'mmseg::segmenter/segmenter_vit-t_mask_8xb1-160k_ade20k-512x512.py',
        'the smallest variant (ViT-tiny)',
    ),
    'mmseg/stdc': (
        'mmseg::stdc/stdc1_4xb12-80k_cityscapes-512x1024.py',
        'the smaller variant (STDC1)',
    ),
    'mmseg/swin': (
        'mmseg::swin/swin-tiny-patch4-window7-in1k-pre_upernet_8xb2-160k_'
        'ade20k-512x512.py',
        'the LEVIR-CD config is change detection (image pairs)',
    ),
    'mmseg/san': (
        'mmseg::san/san-vit-b16_pascal_context-640x640.py',
        'the smaller CLIP (ViT-B/16)',
    ),
}


def config_root(package: str) -> str:
    """The ``.mim/configs`` folder of an installed package.

    Raises:
        ValueError: ``package`` is not installed.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            f'package {package!r} is not installed; expected one of '
            f'{PACKAGES} in this environment'
        )
    return osp.join(spec.submodule_search_locations[0], '.mim', 'configs')


def all_configs(package: str) -> List[str]:
    """Every config of ``package`` as ``'package::family/.../name.py'``,
    sorted, ``_base_`` folders excluded."""
    import glob

    root = config_root(package)
    found = []
    for path in glob.glob(osp.join(root, '**', '*.py'), recursive=True):
        rel = osp.relpath(path, root)
        if '_base_' in rel.split(osp.sep):
            continue
        found.append(f'{package}::{rel}')
    return sorted(found)


def family_of(config: str) -> str:
    """``'mmdet/faster_rcnn'`` for ``'mmdet::faster_rcnn/x.py'``."""
    package, _, rel = config.partition('::')
    return f'{package}/{rel.split("/")[0]}'


def families(package: str) -> Dict[str, List[str]]:
    """Family -> its configs, for one package."""
    out: Dict[str, List[str]] = {}
    for config in all_configs(package):
        out.setdefault(family_of(config), []).append(config)
    return out


def representative_score(config: str) -> float:
    """How well a config suits the CPU sweep (higher is better).

    Args:
        config (str): ``'package::family/name.py'``.

    Returns:
        float: The score: backbone size, main data set, no AMP or long or
        multi-scale variant, shorter names first.
    """
    package, _, rel = config.partition('::')
    name = osp.basename(rel).lower()
    score = 0.0
    for pattern, value in _PREFER:
        if re.search(pattern, name):
            score += value
            break
    if MAIN_DATASET[package] in name:
        score += 20
    if package == 'mmseg' and 'ade20k' in name:
        score += 15
    score -= 15 * len(re.findall(_AVOID, name))
    if '/' in rel[len(rel.split('/')[0]) + 1 :]:
        score -= 5  # a sub-folder: a variant (other data set, ...)
    return score - len(name) / 100.0


def representative(
    family: str,
    configs: List[str],
    usable: Optional[Callable[[str], bool]] = None,
) -> Tuple[str, str]:
    """The config of ``family`` for the training sweep, and why.

    Args:
        family (str): ``'mmdet/faster_rcnn'``.
        configs (list[str]): The family's configs.
        usable (callable, optional): ``usable(config)``: whether a config
            can be a representative (e.g. it loads and has a model); the
            best usable one is taken, the best of all when none is.

    Returns:
        tuple: ``(config, reason)``.
    """
    if family in REPRESENTATIVES:
        return REPRESENTATIVES[family]
    ranked = sorted(
        configs, key=lambda c: (representative_score(c), c), reverse=True
    )
    if usable is not None:
        for rank, config in enumerate(ranked):
            if usable(config):
                why = 'highest representative_score'
                if rank:
                    why += f' of the usable ones ({rank} better ones are not)'
                return config, why
        return ranked[0], 'highest representative_score (none is usable)'
    return ranked[0], 'highest representative_score'
