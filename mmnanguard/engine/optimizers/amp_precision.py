# Copyright (c) mmnanguard contributors. All rights reserved.
"""Switch an ``AmpOptimWrapper`` to bf16 or fp32 autocast mid-run."""

from contextlib import contextmanager
from typing import Dict, Type

import torch
from mmengine.optim import AmpOptimWrapper, OptimWrapper

#: Precisions a collapsed fp16 run can switch to, in escalation order.
PRECISIONS = ('float16', 'bfloat16', 'float32')


class FP32OptimContextMixin:
    """Put in front of an ``AmpOptimWrapper`` class: ``optim_context``
    without autocast (the forward runs in fp32), everything else, the
    GradScaler's inf checks included, unchanged."""

    @contextmanager
    def optim_context(self, model: torch.nn.Module):
        """Gradient-accumulation context only, no autocast."""
        with OptimWrapper.optim_context(self, model):
            yield


_FP32_CLASSES: Dict[Type, Type] = {}


def precision_of(wrapper: AmpOptimWrapper) -> str:
    """``'float16'``, ``'bfloat16'`` or ``'float32'``: what the forward of
    ``wrapper``'s ``optim_context`` computes in."""
    if isinstance(wrapper, FP32OptimContextMixin):
        return 'float32'
    return str(wrapper.cast_dtype or torch.float16).replace('torch.', '')


def device_type_of(wrapper: AmpOptimWrapper) -> str:
    """``'cuda'``, ``'cpu'``, ...: where ``wrapper``'s parameters live."""
    for group in wrapper.optimizer.param_groups:
        for param in group['params']:
            return param.device.type
    return 'cpu'


def bf16_supported(wrapper: AmpOptimWrapper) -> bool:
    """Whether bf16 autocast is available where ``wrapper`` trains.

    CPU autocast supports bf16 everywhere; CUDA needs compute capability
    8.0 or newer (``torch.cuda.is_bf16_supported``).
    """
    device = device_type_of(wrapper)
    if device == 'cuda':
        return torch.cuda.is_bf16_supported()
    return device == 'cpu'


def switch_precision(
    wrapper: AmpOptimWrapper, precision: str, reset_scale: bool = True
) -> None:
    """Make the rest of the run compute in ``precision``.

    The GradScaler stays: it keeps skipping steps with non-finite
    gradients (which the guard relies on under AMP). With ``reset_scale``
    its scale is reset to 1.0 and its growth tracker to 0, other settings
    kept (bf16 and fp32 need no loss scaling; a collapsed scale would only
    lose precision). A resumed run re-applies a switch without a reset: its
    scaler state comes from the checkpoint.

    Args:
        wrapper (AmpOptimWrapper): One wrapper (not a dict).
        precision (str): ``'bfloat16'`` or ``'float32'``.
        reset_scale (bool): Reset the GradScaler's scale to 1.0. Defaults
            to True.

    Raises:
        ValueError: For another precision, or bf16 where the device lacks
            it.
    """
    if precision == 'bfloat16':
        if not bf16_supported(wrapper):
            raise ValueError(
                f'AMP precision switch: bfloat16 is not supported on '
                f'{device_type_of(wrapper)!r}; use on_collapse="fp32"'
            )
        wrapper.cast_dtype = torch.bfloat16
    elif precision == 'float32':
        cls = type(wrapper)
        if not isinstance(wrapper, FP32OptimContextMixin):
            if cls not in _FP32_CLASSES:
                _FP32_CLASSES[cls] = type(
                    f'FP32{cls.__name__}', (FP32OptimContextMixin, cls), {}
                )
            wrapper.__class__ = _FP32_CLASSES[cls]
    else:
        raise ValueError(
            f'AMP precision switch: precision={precision!r} '
            "is invalid; expected 'bfloat16' or 'float32'"
        )
    scaler = wrapper.loss_scaler
    state = scaler.state_dict()
    if state and reset_scale:  # an enabled GradScaler
        state.update(scale=1.0, _growth_tracker=0)
        scaler.load_state_dict(state)
