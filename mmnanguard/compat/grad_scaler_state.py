# Copyright (c) mmnanguard contributors. All rights reserved.
"""The device state of torch's :class:`GradScaler`, read without a host
read.

``GradScaler.get_scale()`` and the public accessors copy the scale to the
host; the guard folds the scaler's verdict into its one read instead, so it
takes the tensors torch keeps privately: ``_per_optimizer_states[id(
optimizer)]['found_inf_per_device']`` (filled by ``unscale_``),
``_scale`` and ``_growth_tracker``. Checked on torch 2.13 and 2.14 (the
supported stacks); :func:`amp_state` raises :class:`RuntimeError` naming the
field when one is gone, and ``tests/test_compat/test_grad_scaler_state.py``
fails the same way on a torch that changed them.
"""

from typing import Any, List, Optional

import torch
from torch import Tensor

#: The private fields read, for the error that names a missing one.
FIELDS = ('_per_optimizer_states', '_scale', '_growth_tracker')


def amp_state(scaler: Any, optimizer: Any) -> Optional[List[Tensor]]:
    """``found_inf`` (summed over devices), scale and growth tracker of an
    enabled GradScaler that unscaled ``optimizer``, as device tensors.

    Args:
        scaler (GradScaler | None): The scaler.
        optimizer (Optimizer): The optimizer it unscaled.

    Returns:
        list[Tensor] | None: The three tensors; None for no scaler or a
        disabled one.

    Raises:
        RuntimeError: A private field of the scaler is gone (a torch this
            module was not checked on).
    """
    if scaler is None or not scaler.is_enabled():
        return None
    missing = [f for f in FIELDS if not hasattr(scaler, f)]
    if missing:
        raise RuntimeError(
            f'nanguard: {type(scaler).__name__} of torch '
            f'{torch.__version__} has no {missing}; mmnanguard reads them '
            'to check AMP steps without a host read (checked on torch 2.13 '
            'and 2.14)'
        )
    state = scaler._per_optimizer_states[id(optimizer)]
    found = list(state['found_inf_per_device'].values())
    scale = scaler._scale
    device = scale.device
    found_inf = (
        torch.stack([f.to(device) for f in found]).sum()
        if found
        else torch.zeros((), device=device)
    )
    return [found_inf, scale, scaler._growth_tracker]


def forget_unscale(scaler: Any, optimizer: Any) -> None:
    """Discard ``scaler``'s record that it unscaled ``optimizer`` this step
    (what ``GradScaler.update`` does), leaving the scale as it is: the
    guard dropped the step, no overflow did.

    Args:
        scaler (GradScaler): The scaler.
        optimizer (Optimizer): The optimizer it unscaled.

    Raises:
        RuntimeError: ``_per_optimizer_states`` is gone (a torch this
            module was not checked on).
    """
    states = getattr(scaler, '_per_optimizer_states', None)
    if states is None:
        raise RuntimeError(
            f'nanguard: {type(scaler).__name__} of torch '
            f'{torch.__version__} has no _per_optimizer_states; mmnanguard '
            'clears it when it drops a step (checked on torch 2.13 and '
            '2.14)'
        )
    states.pop(id(optimizer), None)
