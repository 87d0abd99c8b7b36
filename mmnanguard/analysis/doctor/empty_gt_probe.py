# Copyright (c) mmnanguard contributors. All rights reserved.
"""Whether a dense head can take an image without ground truth: build the
head alone (no backbone), give it random features of the right shapes and
compute its loss and gradient, once with one box and once with none."""

from typing import List, Optional, Tuple

import torch
import torch.nn as nn
from mmengine.registry import DefaultScope
from mmengine.structures import InstanceData

from mmnanguard.config_walk import build_in_scope

_SIZE = 256


def _gt_boxes(rotated: bool, count: int):
    """``count`` boxes (0 or 1), rotated or horizontal."""
    if rotated:
        from mmrotate.structures.bbox import RotatedBoxes

        return RotatedBoxes(
            torch.tensor([[100.0, 100.0, 40.0, 20.0, 0.3]])[:count]
        )
    return torch.tensor([[50.0, 50.0, 120.0, 90.0]])[:count]


class CannotProbe(Exception):
    """The head does not say what features it takes."""


def level_channels(head: nn.Module, levels: int) -> List[int]:
    """The channels of each input level of a built dense head: its
    ``in_channels``, or its ``head_module``'s (mmyolo's heads keep them
    there, already widened), an int meaning every level.

    Raises:
        CannotProbe: Neither says it.
    """
    for owner in (head, getattr(head, 'head_module', None)):
        value = getattr(owner, 'in_channels', None)
        if isinstance(value, int) and not isinstance(value, bool):
            return [value] * levels
        if isinstance(value, (list, tuple)) and len(value) == levels:
            if all(isinstance(v, int) for v in value):
                return list(value)
    raise CannotProbe(
        f'cannot probe it: {type(head).__name__} has no in_channels for its '
        f'{levels} levels (nor has its head_module), so the shapes of its '
        'input features are unknown without building the neck'
    )


def _loss(head: nn.Module, rotated: bool, count: int) -> float:
    """Sum of the head's losses on random features and ``count`` GT boxes,
    after a backward pass; non-finite if a value or gradient is."""
    from mmdet.structures import DetDataSample

    strides = [
        s[0] if isinstance(s, (tuple, list)) else s
        for s in head.prior_generator.strides
    ]
    gen = torch.Generator().manual_seed(0)
    feats = tuple(
        torch.randn(
            1, c, max(_SIZE // s, 1), max(_SIZE // s, 1), generator=gen
        ).requires_grad_()
        for c, s in zip(level_channels(head, len(strides)), strides)
    )
    sample = DetDataSample(
        metainfo=dict(
            img_shape=(_SIZE, _SIZE),
            pad_shape=(_SIZE, _SIZE),
            batch_input_shape=(_SIZE, _SIZE),
            scale_factor=(1.0, 1.0),
        )
    )
    sample.gt_instances = InstanceData(
        bboxes=_gt_boxes(rotated, count),
        labels=torch.zeros(count, dtype=torch.long),
    )
    losses = head.loss(feats, [sample])
    terms = [
        t
        for v in losses.values()
        for t in (v if isinstance(v, (list, tuple)) else [v])
    ]
    total = sum(t.sum() for t in terms)
    grads = torch.autograd.grad(total, feats, allow_unused=True)
    bad_grad = any(
        g is not None and not torch.isfinite(g).all() for g in grads
    )
    return float('nan') if bad_grad else float(total.detach())


def probe_empty_gt(
    head_cfg: dict, scope: Optional[str], rotated: bool
) -> Tuple[Optional[str], Optional[str]]:
    """Run a dense head on one box and on none.

    Args:
        head_cfg (dict): The head config, with its ``train_cfg`` and
            ``test_cfg``.
        scope (str, optional): The config's default scope.
        rotated (bool): Whether the dataset gives rotated boxes
            (mmrotate's ``RotatedBoxes``) instead of ``xyxy`` tensors.

    Returns:
        tuple: ``(failure, unknown)``: what goes wrong without ground truth
        while one box works (None if nothing does), and why the probe
        could not tell (None if it could).
    """
    with DefaultScope.overwrite_default_scope(scope):
        try:
            head = build_in_scope(head_cfg, scope)
            with_box = _loss(head, rotated, 1)
        except CannotProbe as err:
            return None, str(err)
        except Exception as err:  # returned as the reason
            return None, f'{type(err).__name__}: {err}'
        if not torch.isfinite(torch.tensor(with_box)):
            return None, 'its loss is not finite even with one box'
        try:
            empty = _loss(head, rotated, 0)
        except Exception as err:  # returned as the finding
            return f'it raises {type(err).__name__}: {err}', None
    if not torch.isfinite(torch.tensor(empty)):
        return f'its loss or gradient is {empty}', None
    return None, None
