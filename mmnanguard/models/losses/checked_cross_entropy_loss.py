# Copyright (c) mmnanguard contributors. All rights reserved.
"""Cross-entropy that checks its labels before they reach the kernel.

A label outside ``[0, num_classes)`` that is not the ``ignore_index`` (the
classic case: Cityscapes' ``255`` void label with no ``ignore_index`` set)
makes ``F.cross_entropy`` fail with a CUDA device-side assert on the GPU,
an ``IndexError`` on the CPU, or, through one-hot paths, a silently wrong
or NaN loss. :func:`check_cross_entropy_labels` raises a ``ValueError``
that names the bad value, ``num_classes`` and ``ignore_index`` instead.
"""

from typing import Any, List, Optional, Union

import torch
import torch.nn as nn
from mmengine.registry import DefaultScope
from torch import Tensor

from mmnanguard.registry import MODELS, register_shared

_IMPLS = ('mmdet', 'mmseg')
# Default scope -> the upstream CrossEntropyLoss the module behaves like.
_SCOPE_TO_IMPL = {'mmdet': 'mmdet', 'mmrotate': 'mmdet', 'mmseg': 'mmseg'}
_TORCH_DEFAULT_IGNORE = -100


class InvalidLabelError(ValueError):
    """A class label is outside ``[0, num_classes)`` and not ``ignore_index``.

    The message names the bad value, ``num_classes`` and ``ignore_index``
    (and suggests ``ignore_index=255`` for Cityscapes' void label).
    """


def check_cross_entropy_labels(
    label: Tensor,
    num_classes: int,
    ignore_index: Optional[int] = None,
    name: str = 'CrossEntropyLoss',
) -> None:
    """Raise if a label is outside ``[0, num_classes)`` and not ignored.

    The check reads the labels back to the host (one synchronisation on
    the GPU).

    Args:
        label (Tensor): Integer class labels of any shape.
        num_classes (int): Number of valid classes; labels must lie in
            ``[0, num_classes)``.
        ignore_index (int, optional): A label value that is skipped by the
            loss and therefore allowed. Defaults to None.
        name (str): Who checks, for the message.
            Defaults to 'CrossEntropyLoss'.

    Raises:
        InvalidLabelError: If a label is out of range (a ``ValueError``).
            The message gives the bad
            value(s), their count, ``num_classes`` and ``ignore_index``,
            and suggests ``ignore_index=255`` when 255 is among them.
        TypeError: If ``label`` is not an integer tensor.
    """
    if label.is_floating_point() or label.is_complex():
        raise TypeError(
            f'{name}: labels must be an integer tensor of '
            f'class indices, got dtype {label.dtype}'
        )
    valid = (label >= 0) & (label < num_classes)
    if ignore_index is not None:
        valid |= label == ignore_index
    if bool(valid.all()):
        return
    bad = label[~valid]
    bad_values: List[int] = torch.unique(bad).tolist()
    shown = bad_values[:8]
    more = '' if len(bad_values) <= 8 else f' and {len(bad_values) - 8} more'
    msg = (
        f'{name}: label value {bad_values[0]} is outside [0, '
        f'{num_classes}) and is not ignore_index ({ignore_index}); '
        f'{bad.numel()} of {label.numel()} labels are invalid, values '
        f'{shown}{more}. num_classes={num_classes}, '
        f'ignore_index={ignore_index}.'
    )
    if 255 in bad_values:
        msg += (
            ' 255 is the void label of Cityscapes / ADE20K style '
            'annotations: set ignore_index=255 (mmseg: '
            'decode_head.ignore_index=255; mmdet: '
            'CrossEntropyLoss(ignore_index=255)).'
        )
    else:
        msg += (
            ' Check the dataset classes (metainfo) against the '
            "model's num_classes, or set ignore_index."
        )
    raise InvalidLabelError(msg)


def _impl_from_scope() -> str:
    """The upstream flavour that matches the current default scope."""
    scope = DefaultScope.get_current_instance()
    scope_name = None if scope is None else scope.scope_name
    if scope_name not in _SCOPE_TO_IMPL:
        raise ValueError(
            'CheckedCrossEntropyLoss: cannot tell from the default scope '
            f'({scope_name!r}) whether to behave like mmdet or mmseg; set '
            "impl='mmdet' or impl='mmseg'"
        )
    return _SCOPE_TO_IMPL[scope_name]


@register_shared(MODELS)
class CheckedCrossEntropyLoss(nn.Module):
    """Drop-in for mmdet's and mmseg's ``CrossEntropyLoss`` that checks
    labels.

    The loss itself is computed by the upstream ``CrossEntropyLoss`` of
    ``impl``, unchanged. Before that, every label must lie in
    ``[0, num_classes)`` or equal the ``ignore_index``, where
    ``num_classes`` is what the upstream kernel indexes:

    - softmax: ``cls_score.size(1)`` (mmdet's ROI heads include the
      background channel, so their background label is in range);
    - sigmoid, mmdet: ``C + 1`` (label ``C`` is background);
    - sigmoid, mmseg: ``2`` for a single channel, else ``C``.

    Not checked: targets of the same shape as ``cls_score`` or of a
    floating dtype (they are targets, not indices) and ``use_mask=True``.
    :meth:`wrapping` checks an upstream loss that is already built.

    Args:
        impl (str, optional): 'mmdet' or 'mmseg': which upstream loss to
            behave like. None takes it from the default scope (mmdet and
            mmrotate -> 'mmdet', mmseg -> 'mmseg') and raises elsewhere.
            Defaults to None.
        use_sigmoid (bool): As upstream. Defaults to False.
        use_mask (bool): As upstream. Defaults to False.
        reduction (str): As upstream. Defaults to 'mean'.
        class_weight (list[float] | str, optional): As upstream.
            Defaults to None.
        ignore_index (int, optional): Default ignore index of ``forward``
            (mmdet's constructor argument; mmseg heads pass theirs to
            ``forward``). None means PyTorch's -100. Defaults to None.
        loss_weight (float): As upstream. Defaults to 1.0.
        loss_name (str): mmseg's loss item name. Defaults to 'loss_ce'.
        avg_non_ignore (bool): As upstream. Defaults to False.

    Example:
        >>> # mmseg: decode_head=dict(ignore_index=255, loss_decode=dict(
        >>> #     type='CheckedCrossEntropyLoss', use_sigmoid=False))
        >>> # mmdet: loss_cls=dict(type='CheckedCrossEntropyLoss',
        >>> #     use_sigmoid=False, loss_weight=1.0)
    """

    def __init__(
        self,
        impl: Optional[str] = None,
        use_sigmoid: bool = False,
        use_mask: bool = False,
        reduction: str = 'mean',
        class_weight: Optional[Union[List[float], str]] = None,
        ignore_index: Optional[int] = None,
        loss_weight: float = 1.0,
        loss_name: str = 'loss_ce',
        avg_non_ignore: bool = False,
    ) -> None:
        super().__init__()
        if impl is None:
            impl = _impl_from_scope()
        if impl not in _IMPLS:
            raise ValueError(
                "CheckedCrossEntropyLoss: impl must be 'mmdet' "
                f"or 'mmseg', got {impl!r}"
            )
        self.impl = impl
        self.ignore_index = ignore_index
        self._loss_name = loss_name
        if impl == 'mmseg':
            from mmseg.models.losses import CrossEntropyLoss

            self.loss = CrossEntropyLoss(
                use_sigmoid=use_sigmoid,
                use_mask=use_mask,
                reduction=reduction,
                class_weight=class_weight,
                loss_weight=loss_weight,
                loss_name=loss_name,
                avg_non_ignore=avg_non_ignore,
            )
        else:
            from mmdet.models.losses import CrossEntropyLoss

            self.loss = CrossEntropyLoss(
                use_sigmoid=use_sigmoid,
                use_mask=use_mask,
                reduction=reduction,
                class_weight=class_weight,
                ignore_index=ignore_index,
                loss_weight=loss_weight,
                avg_non_ignore=avg_non_ignore,
            )
        self.use_sigmoid = use_sigmoid
        self.use_mask = use_mask

    @classmethod
    def wrapping(cls, loss: nn.Module, impl: str) -> 'CheckedCrossEntropyLoss':
        """Check the labels of an already built upstream loss.

        The returned module computes with ``loss`` itself (same arguments,
        same class weights), so it replaces ``loss`` in a built model.

        Args:
            loss (nn.Module): An upstream ``CrossEntropyLoss`` of ``impl``.
            impl (str): 'mmdet' or 'mmseg'.

        Returns:
            CheckedCrossEntropyLoss: The checking module.

        Raises:
            ValueError: ``impl`` is neither 'mmdet' nor 'mmseg'.
        """
        if impl not in _IMPLS:
            raise ValueError(
                "CheckedCrossEntropyLoss: impl must be 'mmdet' "
                f"or 'mmseg', got {impl!r}"
            )
        checked = cls.__new__(cls)
        nn.Module.__init__(checked)
        checked.impl = impl
        checked.ignore_index = getattr(loss, 'ignore_index', None)
        checked._loss_name = getattr(loss, '_loss_name', 'loss_ce')
        checked.loss = loss
        checked.use_sigmoid = bool(getattr(loss, 'use_sigmoid', False))
        checked.use_mask = bool(getattr(loss, 'use_mask', False))
        return checked

    def __getattr__(self, name: str) -> Any:
        """Attributes the heads read off their loss (``class_weight``,
        ``reduction``, ...) come from the upstream loss."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            loss = self.__dict__.get('_modules', {}).get('loss')
            if loss is None:
                raise
            return getattr(loss, name)

    def extra_repr(self) -> str:
        """Extra repr."""
        return f'impl={self.impl!r}, ignore_index={self.ignore_index}'

    def num_label_classes(self, cls_score: Tensor) -> int:
        """The label range ``[0, n)`` that the upstream kernel accepts.

        Args:
            cls_score (Tensor): Scores of shape (N, C) or (N, C, H, W).

        Returns:
            int: ``n``.
        """
        channels = cls_score.size(1)
        if not self.use_sigmoid:
            return channels
        if self.impl == 'mmdet':
            return channels + 1
        return 2 if channels == 1 else channels

    def forward(
        self,
        cls_score: Tensor,
        label: Tensor,
        weight: Optional[Tensor] = None,
        avg_factor: Optional[Union[int, float]] = None,
        reduction_override: Optional[str] = None,
        ignore_index: Optional[int] = None,
        **kwargs: Any,
    ) -> Tensor:
        """Check the labels, then compute the upstream loss.

        Args:
            cls_score (Tensor): Class scores.
            label (Tensor): Class indices.
            weight (Tensor, optional): Sample-wise weight (the class labels
                with ``use_mask``). Defaults to None.
            avg_factor (int | float, optional): Divisor of the mean.
                Defaults to None.
            reduction_override (str, optional): 'none', 'mean' or 'sum'.
                Defaults to None.
            ignore_index (int, optional): Ignored label. None uses the
                constructor's, then -100. Defaults to None.
            **kwargs: Passed on to the upstream loss.

        Returns:
            Tensor: The loss.

        Raises:
            ValueError: If a label is out of range (see
                :func:`check_cross_entropy_labels`).
        """
        if ignore_index is None:
            ignore_index = self.ignore_index
        checked_ignore = (
            _TORCH_DEFAULT_IGNORE if ignore_index is None else ignore_index
        )
        if self.takes_class_labels(cls_score, label):
            check_cross_entropy_labels(
                label,
                self.num_label_classes(cls_score),
                checked_ignore,
                name=f'CheckedCrossEntropyLoss({self.impl})',
            )
        if self.impl == 'mmseg':
            # mmseg's kernels need an int; mmdet's take None as -100 and
            # its mask cross-entropy refuses anything but None
            ignore_index = checked_ignore
        loss = self.loss(
            cls_score,
            label,
            weight,
            avg_factor=avg_factor,
            reduction_override=reduction_override,
            ignore_index=ignore_index,
            **kwargs,
        )
        if self._is_empty_mean(cls_score, avg_factor, reduction_override):
            # mmdet's mean over 0 samples is 0 / 0 = nan: a zero of the
            # same shape instead, with a (zero-size) gradient to the scores
            return torch.zeros_like(loss) + cls_score.sum()
        return loss

    def _is_empty_mean(
        self,
        cls_score: Tensor,
        avg_factor: Optional[Union[int, float]],
        reduction_override: Optional[str],
    ) -> bool:
        """Whether this is mmdet's NaN case: a 'mean' without
        ``avg_factor`` over zero scores (mmseg's is finite already).

        Args:
            cls_score (Tensor): Class scores.
            avg_factor (int | float, optional): Divisor of the mean.
            reduction_override (str, optional): The call's reduction.

        Returns:
            bool: True where the upstream loss is 0 / 0.
        """
        reduction = reduction_override or self.loss.reduction
        return (
            self.impl == 'mmdet'
            and cls_score.numel() == 0
            and reduction == 'mean'
            and avg_factor is None
        )

    def takes_class_labels(self, cls_score: Tensor, label: Tensor) -> bool:
        """Whether ``label`` holds class indices for ``cls_score``: not a
        mask loss, one dimension less than the scores, an integer dtype
        (binary targets of the scores' shape are not class labels).

        Args:
            cls_score (Tensor): Class scores.
            label (Tensor): The targets passed with them.

        Returns:
            bool: True where the labels are checked.
        """
        return (
            not self.use_mask
            and label.dim() != cls_score.dim()
            and not (label.is_floating_point() or label.is_complex())
        )

    @property
    def loss_name(self) -> str:
        """Name of the loss item (mmseg convention)."""
        return self._loss_name
