# Copyright (c) mmnanguard contributors. All rights reserved.
"""Forward + backward time of each safe module against its upstream
counterpart, on the CPU, interleaved in one run.

Usage::

    python benchmarks/safe_modules.py [--rounds 15] [--threads 1]

Each round times every pair once, in alternating order; the table gives
the median of the per-round ratios (safe / upstream) with their min and
max. Target: a median of 1.3x or less.
"""

import argparse
import math
import statistics
import time

import torch

import mmnanguard  # noqa: F401  (before mmrotate.models)
from mmnanguard.models.losses import (
    CheckedCrossEntropyLoss,
    SafeDiceLoss,
    SafeGDLoss,
    SafeRotatedIoULoss,
    StableFocalLoss,
)
from mmnanguard.models.task_modules import (
    SafeDeltaXYWHTRBBoxCoder,
    SinCosAngleCoder,
)


def _rboxes(n, g):
    return torch.cat(
        [
            torch.rand(n, 2, generator=g) * 800,
            torch.rand(n, 2, generator=g) * 60 + 4,
            (torch.rand(n, 1, generator=g) - 0.5) * math.pi,
        ],
        1,
    )


def _fwd_bwd(fn, *inputs):
    """A closure that runs ``fn`` forward and backward on fresh leaves."""

    def run():
        leaves = [
            x.detach().requires_grad_()
            if x.is_floating_point() and i == 0
            else x
            for i, x in enumerate(inputs)
        ]
        out = fn(*leaves)
        out = out.tensor if hasattr(out, 'tensor') else out
        out.float().sum().backward()

    return run


def mmcv_rotated_iou_loss_cpu(pred, target, eps=1e-6):
    """mmrotate's ``rotated_iou_loss`` ('log') on the CPU: mmcv's
    ``diff_iou_rotated_2d`` with its CUDA-only vertex sort replaced by a
    ``torch.argsort`` that builds the same index layout. For timing only
    (no care for more than 8 valid vertices)."""
    from mmcv.ops import diff_iou_rotated as D

    c1, c2 = D.box2corners(pred[None]), D.box2corners(target[None])
    inter, mask_i = D.box_intersection(c1, c2)
    c12, c21 = D.box_in_box(c1, c2)
    vertices, mask = D.build_vertices(c1, c2, c12, c21, inter, mask_i)
    with torch.no_grad():
        num_valid = mask.sum(2)
        mean = (vertices * mask[..., None]).sum(
            2, keepdim=True
        ) / num_valid.clamp(min=1)[..., None, None]
        rel = vertices - mean
        key = torch.where(mask, torch.atan2(rel[..., 1], rel[..., 0]), 10.0)
        order = key.argsort(dim=2)[..., :9]
        pad = (~mask[..., 8:]).float().argmax(dim=2, keepdim=True) + 8
        pos = torch.arange(9)
        idx = torch.where(pos < num_valid[..., None], order, pad)
        idx = torch.where(pos == num_valid[..., None], order[..., :1], idx)
    area, _ = D.calculate_area(idx, vertices)
    area1 = pred[:, 2] * pred[:, 3]
    area2 = target[:, 2] * target[:, 3]
    ious = (area[0] / (area1 + area2 - area[0])).clamp(min=eps)
    return -ious.log().mean()


def build_pairs():
    """(name, safe closure, upstream closure, note) for every module."""
    from mmdet.models.losses import DiceLoss as MMDetDice
    from mmdet.models.losses import FocalLoss
    from mmrotate.models.losses import GDLoss
    from mmrotate.models.task_modules.coders import (
        DeltaXYWHTRBBoxCoder,
        PSCCoder,
    )
    from mmseg.models.losses import CrossEntropyLoss as MMSegCE
    from mmseg.models.losses import DiceLoss as MMSegDice

    g = torch.Generator().manual_seed(0)
    pairs = []
    # focal: 2 images of anchors at 256 px, 15 DOTA classes
    logits = torch.randn(20000, 15, generator=g) * 3
    labels = torch.randint(0, 16, (20000,), generator=g)
    pairs.append(
        (
            'StableFocalLoss vs mmdet.FocalLoss',
            _fwd_bwd(StableFocalLoss(), logits, labels),
            _fwd_bwd(FocalLoss(), logits, labels),
            '',
        )
    )
    # coder decode (differentiable when reg_decoded_bbox=True)
    anchors = _rboxes(20000, g)
    deltas = torch.randn(20000, 5, generator=g) * 0.5
    cfg = dict(angle_version='le90', edge_swap=True, proj_xy=True)
    safe, up = SafeDeltaXYWHTRBBoxCoder(**cfg), DeltaXYWHTRBBoxCoder(**cfg)
    pairs.append(
        (
            'SafeDeltaXYWHTRBBoxCoder.decode vs upstream',
            _fwd_bwd(lambda d, a: safe.decode(a, d), deltas, anchors),
            _fwd_bwd(lambda d, a: up.decode(a, d), deltas, anchors),
            '',
        )
    )
    from mmrotate.structures.bbox import RotatedBoxes

    gts = _rboxes(20000, g)

    def enc(coder):
        return lambda: coder.encode(
            RotatedBoxes(anchors), RotatedBoxes(gts.clone())
        )

    pairs.append(
        (
            'SafeDeltaXYWHTRBBoxCoder.encode vs upstream',
            enc(safe),
            enc(up),
            'forward only (targets)',
        )
    )
    # angle coders: encode targets + decode predictions with gradient
    angles = (torch.rand(20000, 1, generator=g) - 0.5) * math.pi
    sincos, psc = SinCosAngleCoder('le90'), PSCCoder('le90', dual_freq=False)

    def coder_run(coder):
        def run():
            coder.encode(angles)
            pred = torch.randn(
                20000, coder.encode_size, generator=g
            ).requires_grad_()
            coder.decode(pred).sum().backward()

        return run

    pairs.append(
        (
            'SinCosAngleCoder vs PSCCoder(dual_freq=False)',
            coder_run(sincos),
            coder_run(psc),
            'no same-encoding counterpart upstream',
        )
    )
    # rotated IoU: upstream RotatedIoULoss has no CPU kernel (mmcv's vertex
    # sort is CUDA-only): compare with its algorithm made to run on the
    # CPU, and with the Gaussian loss often used in its place
    pred, target = _rboxes(2000, g), _rboxes(2000, g)
    target[:, :2] = pred[:, :2] + torch.randn(2000, 2, generator=g) * 5
    safe_iou = SafeRotatedIoULoss()
    pairs.append(
        (
            'SafeRotatedIoULoss vs mmcv diff_iou + torch sort',
            _fwd_bwd(safe_iou, pred, target),
            _fwd_bwd(mmcv_rotated_iou_loss_cpu, pred, target),
            'RotatedIoULoss: no CPU kernel in mmcv 2.0.1',
        )
    )
    pairs.append(
        (
            'SafeRotatedIoULoss vs GDLoss(kld)',
            _fwd_bwd(safe_iou, pred, target),
            _fwd_bwd(GDLoss('kld'), pred, target),
            'not the same loss',
        )
    )
    pairs.append(
        (
            'SafeGDLoss(kld) vs GDLoss(kld)',
            _fwd_bwd(SafeGDLoss('kld'), pred, target),
            _fwd_bwd(GDLoss('kld'), pred, target),
            '',
        )
    )
    # dice: 8 masks of 128 x 128 (mmdet), 19-class segmentation (mmseg)
    mlogits = torch.randn(8, 128 * 128, generator=g)
    mtarget = (torch.rand(8, 128 * 128, generator=g) > 0.5).float()
    pairs.append(
        (
            'SafeDiceLoss vs mmdet.DiceLoss',
            _fwd_bwd(SafeDiceLoss(), mlogits, mtarget),
            _fwd_bwd(MMDetDice(), mlogits, mtarget),
            '',
        )
    )
    slogits = torch.randn(2, 19, 128, 128, generator=g)
    slabels = torch.randint(0, 19, (2, 128, 128), generator=g)
    pairs.append(
        (
            'SafeDiceLoss vs mmseg.DiceLoss (index targets)',
            _fwd_bwd(SafeDiceLoss(use_sigmoid=False), slogits, slabels),
            _fwd_bwd(MMSegDice(use_sigmoid=False), slogits, slabels),
            '',
        )
    )
    slabels[:, :8] = 255
    checked = CheckedCrossEntropyLoss(impl='mmseg')
    mmseg_ce = MMSegCE()
    pairs.append(
        (
            'CheckedCrossEntropyLoss vs mmseg.CrossEntropyLoss',
            _fwd_bwd(
                lambda x, y: checked(x, y, ignore_index=255), slogits, slabels
            ),
            _fwd_bwd(
                lambda x, y: mmseg_ce(x, y, ignore_index=255), slogits, slabels
            ),
            '',
        )
    )
    return pairs


def _time(fn, repeats):
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--rounds', type=int, default=15)
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--threads', type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pairs = build_pairs()
    for _, safe, up, _ in pairs:  # warm-up
        safe()
        up()
    ratios = {name: [] for name, *_ in pairs}
    times = {name: ([], []) for name, *_ in pairs}
    for r in range(args.rounds):
        for name, safe, up, _ in pairs:
            if r % 2:
                t_up, t_safe = (
                    _time(up, args.repeats),
                    _time(safe, args.repeats),
                )
            else:
                t_safe, t_up = (
                    _time(safe, args.repeats),
                    _time(up, args.repeats),
                )
            ratios[name].append(t_safe / t_up)
            times[name][0].append(t_safe)
            times[name][1].append(t_up)
    print(
        f'torch {torch.__version__}, {args.threads} thread(s), '
        f'{args.rounds} rounds x {args.repeats} repeats, CPU'
    )
    print(
        f'{"pair":52s} {"safe ms":>8s} {"up ms":>8s} {"median":>7s} '
        f'{"min":>6s} {"max":>6s}'
    )
    for name, _, _, note in pairs:
        rs = ratios[name]
        safe_ms = statistics.median(times[name][0]) * 1e3
        up_ms = statistics.median(times[name][1]) * 1e3
        print(
            f'{name:52s} {safe_ms:8.2f} {up_ms:8.2f} '
            f'{statistics.median(rs):6.2f}x {min(rs):5.2f}x '
            f'{max(rs):5.2f}x' + (f'  ({note})' if note else '')
        )


if __name__ == '__main__':
    main()
