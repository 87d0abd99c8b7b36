# Copyright (c) mmnanguard contributors. All rights reserved.
"""``AmpOptimWrapper`` on the CPU, for tests and CPU mixed precision."""

from contextlib import contextmanager
from typing import Union

import torch
from mmengine.optim import AmpOptimWrapper, OptimWrapper

from mmnanguard.registry import OPTIM_WRAPPERS, register_shared


@register_shared(OPTIM_WRAPPERS)
class CPUAmpOptimWrapper(AmpOptimWrapper):
    """mmengine's ``AmpOptimWrapper`` with ``torch.amp.GradScaler('cpu')``.

    mmengine 0.10.7's ``AmpOptimWrapper`` asserts that CUDA (or NPU/MLU)
    is available and its ``autocast`` accepts only bfloat16 on the CPU.
    This subclass builds the same wrapper around the CPU GradScaler and
    enters ``torch.autocast('cpu', dtype)`` with fp16 or bf16, so that the
    real GradScaler machinery (inf checks, skipped steps, scale updates,
    ``state_dict``) runs in CPU tests. Everything else is inherited.

    ``tests/test_engine/test_hooks/test_amp_scale_monitor_hook.py`` drives
    it into a real fp16 gradient overflow that collapses the scale. What it
    cannot show: CUDA's autocast op lists (which ops run in fp16 differ
    between the CPU and CUDA) and the mmcv CUDA kernels in fp16; those need
    a GPU and mmengine's own ``AmpOptimWrapper``. A float ``loss_scale``
    is static (mmengine passes it to every ``update``): its skipped steps
    do not show in the scale.

    Args:
        loss_scale (str | float | dict): ``'dynamic'``, a static scale, or
            GradScaler arguments. Defaults to ``'dynamic'``.
        dtype (str | torch.dtype): ``'float16'`` or ``'bfloat16'``.
            Defaults to ``'float16'``.
        **kwargs: Arguments of :class:`OptimWrapper`.

    Example:
        >>> optim_wrapper = dict(
        ...     type='CPUAmpOptimWrapper', dtype='float16',
        ...     optimizer=dict(type='SGD', lr=0.01))
    """

    def __init__(
        self,
        loss_scale: Union[str, float, dict] = 'dynamic',
        dtype: Union[str, torch.dtype] = 'float16',
        **kwargs,
    ) -> None:
        OptimWrapper.__init__(self, **kwargs)
        self._scale_update_param = None
        if loss_scale == 'dynamic':
            self.loss_scaler = torch.amp.GradScaler('cpu')
        elif isinstance(loss_scale, float):
            self._scale_update_param = loss_scale
            self.loss_scaler = torch.amp.GradScaler(
                'cpu', init_scale=loss_scale
            )
        elif isinstance(loss_scale, dict):
            self.loss_scaler = torch.amp.GradScaler('cpu', **loss_scale)
        else:
            raise TypeError(
                'loss_scale must be "dynamic", a float or a '
                f'dict of GradScaler arguments, got {loss_scale!r}'
            )
        if isinstance(dtype, str):
            if dtype not in self.valid_dtypes:
                raise ValueError(
                    f'dtype={dtype!r} is invalid; expected one '
                    f'of {self.valid_dtypes}'
                )
            dtype = getattr(torch, dtype)
        if dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(
                f'dtype={dtype!r} is invalid for CPU autocast; '
                'expected float16 or bfloat16'
            )
        self.cast_dtype = dtype

    @contextmanager
    def optim_context(self, model: torch.nn.Module):
        """Gradient-accumulation context plus CPU autocast."""
        with OptimWrapper.optim_context(self, model), torch.autocast(
            device_type='cpu', dtype=self.cast_dtype
        ):
            yield
