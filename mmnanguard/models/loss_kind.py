# Copyright (c) mmnanguard contributors. All rights reserved.
"""What a built loss module takes, decided by calling it, and the heads
whose box loss is fed encoded deltas.

A loss's name says little about its inputs: ``DistributionFocalLoss`` has
"focal" in its name and takes a distribution over bins and float
distances, not class scores. :func:`loss_kind` calls the module on small
probe inputs of each form (class indices, ``(labels, scores)`` pairs,
distributions, boxes of 4 and 5 columns, point sets) and keeps the first
form it accepts with a finite value; a box form is then told apart from an
element-wise regression loss (``L1Loss`` accepts boxes too) by permuting
the columns of prediction and target alike, which leaves an element-wise
loss unchanged and changes a loss that reads the columns as a box.

A head with ``reg_decoded_bbox=False`` feeds its box loss the coder's
encoded deltas; an IoU or Gaussian loss then computes an overlap of
deltas, which is meaningless and often non-finite from the first
iteration. :func:`encoded_deltas_into_box_loss` finds those heads.
"""

import copy
import inspect
import math
import re
import warnings
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

import torch
import torch.nn as nn
from torch import Tensor

#: Errors a loss raises on a probe input of the wrong form (a shape
#: assertion, an index out of range, a dtype it does not take, an argument
#: it does not have). Any other error propagates.
PROBE_ERRORS = (
    AssertionError,
    AttributeError,
    RuntimeError,
    IndexError,
    ValueError,
    TypeError,
    NotImplementedError,
)

#: Kinds whose loss reads its inputs as boxes.
BOX_KINDS = ('box', 'rotated_box', 'gaussian', 'quad')


class LossKind(NamedTuple):
    """What a loss takes.

    Args:
        kind (str): ``'classification'``, ``'distribution'``, ``'box'``
            (``xyxy``), ``'rotated_box'`` (``xywha``, overlap family),
            ``'gaussian'`` (``xywha``, Gaussian distance family),
            ``'quad'`` (point sets against polygons), ``'regression'``
            (element-wise: ``L1Loss``, ``SmoothL1Loss``), ``'mask'``,
            ``'segmentation'``.
        targets (str): The form of the targets, in words.
        how (str): How it was decided.
    """

    kind: str
    targets: str
    how: str

    @property
    def takes_boxes(self) -> bool:
        """Whether the loss reads its inputs as boxes."""
        return self.kind in BOX_KINDS

    @property
    def quality_targets(self) -> bool:
        """Whether targets are ``(labels, quality scores)`` pairs."""
        return self.targets.startswith('(class indices, quality')


class EncodedDeltasRecord(NamedTuple):
    """A head whose box-taking loss is fed encoded deltas.

    Args:
        head (str): Module path of the head in the model
            (``'bbox_head'``, ``'roi_head.bbox_head'``).
        loss_type (str): Class name of the loss.
        coder_type (str): Class name of the head's box coder ('' if none).
        loss_name (str): Attribute of the loss on the head.
            Defaults to ``'loss_bbox'``.
    """

    head: str
    loss_type: str
    coder_type: str
    loss_name: str = 'loss_bbox'


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _xyxy() -> Tensor:
    """4 boxes ``xyxy``, x in 100-180, y in 290-370: permuting columns
    (x1, x2, y1, y2) still gives valid, very different boxes."""
    u = torch.rand(4, 4, generator=_generator(1))
    x1, y1 = 100 + 50 * u[:, 0], 290 + 50 * u[:, 1]
    return torch.stack(
        (x1, y1, x1 + 10 + 20 * u[:, 2], y1 + 10 + 20 * u[:, 3]), 1
    )


def _xywha() -> Tensor:
    """4 rotated boxes ``xywha``: centres 100-150, sizes 10-30."""
    u = torch.rand(4, 5, generator=_generator(2))
    return torch.stack(
        (
            100 + 50 * u[:, 0],
            100 + 50 * u[:, 1],
            10 + 20 * u[:, 2],
            10 + 20 * u[:, 3],
            0.5 * u[:, 4] - 0.25,
        ),
        1,
    )


def _noisy(t: Tensor, scale: float) -> Tensor:
    return t + scale * torch.randn(t.shape, generator=_generator(3))


def _value(out: Any) -> Optional[float]:
    """The sum of a loss output (a tensor, or the first tensor of a tuple,
    as mmyolo's ``IoULoss`` returns ``(loss, iou)``; the sum of a dict's
    tensors); None if there is none or it is not finite."""
    if isinstance(out, (tuple, list)) and out:
        out = out[0]
    if isinstance(out, dict):
        tensors = [v for v in out.values() if isinstance(v, Tensor)]
        out = sum(t.double().sum() for t in tensors) if tensors else None
    if not isinstance(out, Tensor) or not out.is_floating_point():
        return None
    value = float(out.detach().double().sum())
    return value if math.isfinite(value) else None


def _required_extra(loss: nn.Module, given: int) -> int:
    """How many required positional arguments ``loss.forward`` has beyond
    ``given`` (mmdet's ``GHMC`` requires ``label_weight``)."""
    params = list(inspect.signature(loss.forward).parameters.values())
    required = [
        p
        for p in params
        if p.default is p.empty
        and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    return max(len(required) - given, 0)


def _call(loss: nn.Module, *args: Any) -> Tuple[Optional[float], str]:
    """``loss(*args)``'s value, or None and the error it raised, on a copy
    of ``loss`` (a stateful loss gives every probe the same state).
    Required arguments beyond ``args`` (weights) are given as ones shaped
    like the prediction."""
    extra = [torch.ones_like(args[0])] * _required_extra(loss, len(args))
    loss = copy.deepcopy(loss)  # each call from the same state
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter('ignore')
            return _value(loss(*args, *extra)), ''
    except PROBE_ERRORS as err:
        return None, f'{type(err).__name__}: {err}'.splitlines()[0]


def _differs(a: float, b: float) -> bool:
    return abs(a - b) > 1e-4 * max(abs(a), abs(b), 1e-6)


def _coupled(loss: nn.Module, pred: Tensor, target: Tensor, perm) -> bool:
    """Whether the loss changes when the columns of prediction and target
    are permuted alike (an element-wise loss does not)."""
    base, _ = _call(loss, pred, target)
    moved, _ = _call(loss, pred[:, perm], target[:, perm])
    return moved is None or (base is not None and _differs(base, moved))


def _overlap_only(loss: nn.Module) -> bool:
    """Whether a rotated box loss depends on the overlap only: a small box
    nested in a larger one at the same centre has the same IoU whatever the
    larger one's angle, an IoU loss gives the same value, a Gaussian
    distance (which compares the shapes) does not."""
    pred = torch.tensor([[100.0, 100.0, 12.0, 1.0, 0.0]])
    flat = torch.tensor([[100.0, 100.0, 40.0, 10.0, 0.0]])
    tilted = torch.tensor([[100.0, 100.0, 40.0, 10.0, 0.7]])
    a, _ = _call(loss, pred, flat)
    b, _ = _call(loss, pred, tilted)
    return a is not None and b is not None and not _differs(a, b)


def _labels() -> Tensor:
    return torch.tensor([0, 1, 2, 3, 0, 1])


def _probe_classification(loss: nn.Module) -> Optional[LossKind]:
    scores = torch.randn(6, 4, generator=_generator(4))
    if _call(loss, scores, _labels())[0] is not None:
        return LossKind('classification', 'class indices', 'probed')
    quality = (_labels(), torch.full((6,), 0.5))
    if _call(loss, scores, quality)[0] is not None:
        return LossKind(
            'classification', '(class indices, quality scores)', 'probed'
        )
    return None


def _probe_one_hot(loss: nn.Module) -> Optional[LossKind]:
    """A loss that takes scores against one-hot (or soft) targets: the
    columns are classes (permuting them alike changes nothing) and
    confident right logits (±20) score lower than the targets themselves
    (an element-wise regression loss scores the targets 0), and not below
    0 (a signed sum does)."""
    hot = torch.nn.functional.one_hot(_labels(), 4).float()
    confident = 20.0 * (2 * hot - 1)
    right, _ = _call(loss, confident, hot)
    itself, _ = _call(loss, hot, hot)
    if right is None or itself is None or not 0 <= right < itself:
        return None
    if _coupled(loss, confident, hot, [1, 2, 3, 0]):
        return None
    return LossKind('classification', 'one-hot scores (N, C)', 'probed')


def _probe_distribution(loss: nn.Module) -> Optional[LossKind]:
    logits = torch.randn(6, 5, generator=_generator(5))
    distances = torch.tensor([0.5, 1.25, 2.0, 3.5, 0.0, 2.75])
    if _call(loss, logits, distances)[0] is None:
        return None
    return LossKind(
        'distribution', 'distances in bins (float, [0, n))', 'probed'
    )


def _no_cpu_kernel(error: str) -> bool:
    """Whether a probe reached an mmcv kernel that has no CPU build (the
    inputs were of the right form)."""
    return bool(re.search(r'for device cpu not found', error, re.I))


def _least_at_target(loss: nn.Module, target: Tensor, scale: float) -> bool:
    """Whether the loss falls as the prediction nears the target: lower
    for a hundredth of a step of noise than for a whole step either way (a
    signed sum, which is no loss, fails one of the two; the target itself
    is not used, as CIoU's value there is 0/0)."""
    near, _ = _call(loss, _noisy(target, scale / 100), target)
    above, _ = _call(loss, _noisy(target, scale), target)
    below, _ = _call(loss, _noisy(target, -scale), target)
    if near is None or above is None or below is None:
        return False
    return near < above and near < below


def _probe_xyxy(loss: nn.Module) -> Optional[LossKind]:
    xyxy = _xyxy()
    if _least_at_target(loss, xyxy, 1.0):
        if _coupled(loss, _noisy(xyxy, 1.0), xyxy, [0, 2, 1, 3]):
            return LossKind('box', 'boxes xyxy (N, 4)', 'probed')
        return LossKind('regression', 'any (element-wise)', 'probed')
    return None


def _probe_xywha(loss: nn.Module) -> Optional[LossKind]:
    rot = _xywha()
    value, error = _call(loss, _noisy(rot, 0.5), rot)
    if value is None and _no_cpu_kernel(error):
        return LossKind(
            'rotated_box',
            'rotated boxes xywha (N, 5)',
            f'accepted the shapes, its kernel has no CPU build ({error})',
        )
    if value is None or not _least_at_target(loss, rot, 0.5):
        return None
    if not _coupled(loss, _noisy(rot, 0.5), rot, [2, 1, 0, 3, 4]):
        return LossKind('regression', 'any (element-wise)', 'probed')
    if _overlap_only(loss):
        return LossKind('rotated_box', 'rotated boxes xywha (N, 5)', 'probed')
    return LossKind('gaussian', 'rotated boxes xywha (N, 5)', 'probed')


def _probe_points(loss: nn.Module) -> Optional[LossKind]:
    rot = _xywha()
    cx, cy, w, h = rot[:, 0], rot[:, 1], rot[:, 2], rot[:, 3]
    corners = torch.stack(
        (cx - w / 2, cy - h / 2, cx + w / 2, cy - h / 2)
        + (cx + w / 2, cy + h / 2, cx - w / 2, cy + h / 2),
        1,
    )
    points = torch.cat((corners, corners, corners[:, :2]), 1)
    value, error = _call(loss, _noisy(points, 0.5), corners)
    if value is not None:
        return LossKind(
            'quad', 'point sets (N, 18) on polygons (N, 8)', 'probed'
        )
    if _no_cpu_kernel(error):
        return LossKind(
            'quad',
            'point sets (N, 18) on polygons (N, 8)',
            f'accepted the shapes, its kernel has no CPU build ({error})',
        )
    return None


#: The probes, in order: a loss that takes class indices is not asked
#: about distributions, one that takes 4-column boxes not about 5; point
#: sets come before 5-column boxes, as a kernel without a CPU build
#: (ConvexGIoU's) fails alike on both and only its own shapes tell.
PROBES: Tuple[Callable[[nn.Module], Optional[LossKind]], ...] = (
    _probe_classification,
    _probe_one_hot,
    _probe_distribution,
    _probe_xyxy,
    _probe_points,
    _probe_xywha,
)


def _mro_names(cls: type) -> str:
    parts = []
    for base in cls.__mro__:
        if base is nn.Module:
            break
        parts += [base.__name__.lower(), base.__module__.lower()]
    return ' '.join(parts)


def _dense_kind(loss: nn.Module, scope: Optional[str]) -> Optional[LossKind]:
    """The kind of a per-pixel loss, read off the built module: a mask
    loss declares ``use_mask``, a segmentation loss lives in mmseg (or is
    built with ``impl='mmseg'``, or names its input ``seg_logit``); a Dice
    loss serves both and follows the config's scope. Per-pixel losses also
    accept class scores, so this is decided before the probes."""
    first = next(iter(inspect.signature(loss.forward).parameters), '')
    seg = (
        type(loss).__module__.split('.')[0] == 'mmseg'
        or getattr(loss, 'impl', None) == 'mmseg'
        or first in ('seg_logit', 'seg_logits')
    )
    how = 'from the built module (use_mask, impl, module, first argument)'
    if getattr(loss, 'use_mask', False) is True:
        return LossKind('mask', 'masks', how)
    if 'dice' in _mro_names(type(loss)):
        if seg or scope == 'mmseg':
            return LossKind('segmentation', 'label maps', how)
        return LossKind('mask', 'masks', how)
    if seg:
        return LossKind('segmentation', 'label maps', how)
    return None


def loss_kind(loss: nn.Module, scope: Optional[str] = None) -> LossKind:
    """What ``loss`` takes, decided by calling it on probe inputs.

    Args:
        loss (nn.Module): The built loss (not modified: the probes run
            on a CPU copy, under ``torch.no_grad``).
        scope (str, optional): The config's default scope (only a Dice
            loss, which serves masks and segmentation alike, needs it).

    Returns:
        LossKind: The kind, the form of its targets and how it was told.

    Raises:
        ValueError: No probe applies; the message names the class.
    """
    dense = _dense_kind(loss, scope)
    if dense is not None:
        return dense
    # on a CPU copy: a stateful loss (SeesawLoss's cum_samples, GHMC's
    # acc_sum) would otherwise count the probes, and a CUDA one reject them
    probed = copy.deepcopy(loss).cpu()
    for probe in PROBES:
        found = probe(probed)
        if found is not None:
            return found
    # the error of the commonest form says whether the module is broken
    # (a bad constructor argument) rather than of another kind
    _, error = _call(
        probed, torch.randn(6, 4, generator=_generator(4)), _labels()
    )
    raise ValueError(
        f'nanguard: cannot tell what {type(loss).__name__} (from '
        f'{type(loss).__module__}) takes: it accepts none of class indices '
        '(N, C)+(N,), (labels, scores) pairs, distributions (N, n+1)+(N,), '
        'boxes (N, 4) or (N, 5), point sets (N, 18)+(N, 8) (class indices '
        f'raised {error})'
    )


def takes_boxes(loss: nn.Module) -> bool:
    """Whether ``loss`` reads its inputs as boxes (the IoU and Gaussian
    families), decided by :func:`loss_kind`; False where it cannot tell."""
    try:
        return loss_kind(loss).takes_boxes
    except ValueError:
        return False


_GOVERNS: Dict[Tuple[type, str], bool] = {}


def _flag_governs_loss(cls: type, loss_name: str) -> bool:
    """Whether ``reg_decoded_bbox`` decides what the head's ``loss_name``
    is fed: a method of the built head's class that calls
    ``self.<loss_name>(`` also reads ``self.reg_decoded_bbox`` (a head
    that decodes on its own, like GFL's, calls its loss without it)."""
    key = (cls, loss_name)
    if key not in _GOVERNS:
        call = f'self.{loss_name}('
        found = False
        for _, func in inspect.getmembers(cls, inspect.isfunction):
            try:
                source = inspect.getsource(func)
            except (OSError, TypeError):
                continue
            if call in source and 'self.reg_decoded_bbox' in source:
                found = True
                break
        _GOVERNS[key] = found
    return _GOVERNS[key]


def encoded_deltas_into_box_loss(
    model: nn.Module,
) -> List[EncodedDeltasRecord]:
    """The heads of ``model`` that feed encoded deltas to a box loss.

    A head is listed when its ``reg_decoded_bbox`` is False, one of its
    methods lets that flag decide whether its loss gets decoded boxes, and
    the loss reads its inputs as boxes (:func:`takes_boxes`: the IoU family
    of mmdet and mmyolo, mmrotate's rotated IoU and Gaussian losses,
    ``GDLoss_v1`` included).

    Args:
        model (nn.Module): The built model.

    Returns:
        list[EncodedDeltasRecord]: One per such head and loss, in module
        order.
    """
    records = []
    for path, head in model.named_modules():
        if getattr(head, 'reg_decoded_bbox', None) is not False:
            continue
        for name, loss in head.named_children():
            if not name.startswith('loss'):
                continue
            if not _flag_governs_loss(type(head), name):
                continue
            if takes_boxes(loss):
                coder = getattr(head, 'bbox_coder', None)
                records.append(
                    EncodedDeltasRecord(
                        head=path,
                        loss_type=type(loss).__name__,
                        coder_type=type(coder).__name__ if coder else '',
                        loss_name=name,
                    )
                )
    return records


def config_path(module_path: str) -> str:
    """``roi_head.bbox_head.0`` -> ``model.roi_head.bbox_head[0]``."""
    parts: List[str] = []
    for part in module_path.split('.'):
        if part.isdigit() and parts:
            parts[-1] += f'[{part}]'
        else:
            parts.append(part)
    return '.'.join(['model'] + parts)


def describe_mismatch(record: EncodedDeltasRecord) -> str:
    """One sentence: the head, the loss, and the fix.

    Args:
        record (EncodedDeltasRecord): A record of
            :func:`encoded_deltas_into_box_loss`.

    Returns:
        str: The sentence, prefixed ``nanguard:``.
    """
    head = config_path(record.head)
    coder = f"{record.coder_type}'s " if record.coder_type else ''
    return (
        f'nanguard: {head}.{record.loss_name} ({record.loss_type}) takes '
        f'boxes, but {head} has reg_decoded_bbox=False, so it is fed the '
        f'{coder}encoded deltas instead of boxes (an overlap of deltas, '
        f'meaningless and often non-finite from the first iteration); set '
        f'{head}.reg_decoded_bbox=True in the head config.'
    )


def encoded_deltas_fix(model: nn.Module) -> Optional[str]:
    """The fix for the first head of ``model`` that feeds encoded deltas to
    a box loss, without the message prefix; None when no head does.

    Args:
        model (nn.Module): The built (unwrapped) model.

    Returns:
        str | None: :func:`describe_mismatch` of the first record.
    """
    found = encoded_deltas_into_box_loss(model)
    if not found:
        return None
    return describe_mismatch(found[0]).replace('nanguard: ', '', 1)
