# Copyright (c) mmnanguard contributors. All rights reserved.
"""Where magnitudes leave the normal range, module by module.

An overflow often turns non-finite only far downstream: weights scaled by
1e38 in an FPN conv give huge but finite outputs, and the inf first
appears in the classification loss. The replay therefore records, per
module call, the largest absolute output, input and own weight
(:class:`~.probe.ActivationProbe`), and this module finds the first call
whose output leaves the normal range:

* beyond the fp16 range (65504) when the replay runs under fp16;
* beyond :data:`FP32_LIMIT` (1e30) otherwise;
* or :data:`JUMP_ORDERS` orders of magnitude above the module's input
  while above :data:`JUMP_FLOOR` itself (a tiny input that becomes an
  ordinary value is no jump).

The overflow is attributed to that module when its own weights are out of
range too (largest absolute weight above :data:`WEIGHT_LIMIT`).
"""

import math
from typing import Any, Dict, List, Optional

import torch
from torch import nn

from ..guard.dtensor import local
from .tree import iter_tensors

FP16_LIMIT = float(torch.finfo(torch.float16).max)
FP32_LIMIT = 1e30
JUMP_ORDERS = 6
JUMP_FLOOR = 1e6
#: Largest absolute weight of a healthy layer is orders of magnitude below.
WEIGHT_LIMIT = 1e4


def max_abs(obj: Any) -> Optional[float]:
    """The largest absolute value over every floating tensor in ``obj``
    (``inf`` when one holds an infinity; NaNs are ignored), or None.

    A sharded tensor (a DTensor, a ``ShardedTensor``) counts with this
    rank's part only, which may be empty: no collective, so that a rank
    diagnosing alone never waits for a peer.
    """
    parts = (local(t) for _, t in iter_tensors(obj))
    values = [
        t.detach().abs().nan_to_num(nan=0.0, posinf=math.inf).max()
        for t in parts
        if t.is_floating_point() and t.numel()
    ]
    return (
        float(torch.stack([v.float() for v in values]).max())
        if values
        else None
    )


def own_weight_max(module: nn.Module) -> Optional[float]:
    """Largest absolute value of the module's own parameters (not its
    children's), or None when it has none."""
    return max_abs(list(module.parameters(recurse=False)))


def range_limit(precision: str) -> float:
    """The largest normal activation for a replay precision."""
    return FP16_LIMIT if precision == 'float16' else FP32_LIMIT


def _why(entry: Dict[str, Any], limit: float) -> Optional[str]:
    out, inp = entry['out_max'], entry['in_max']
    if out is None:
        return None
    if out > limit:
        return f'output max |x| {out:.3g} is beyond {limit:.3g}'
    if inp is not None and out > JUMP_FLOOR and out > inp * 10**JUMP_ORDERS:
        orders = math.log10(out / inp) if inp > 0 else math.inf
        return (
            f'output max |x| {out:.3g} is {orders:.0f} orders of magnitude '
            f'above its input ({inp:.3g})'
        )
    return None


def first_out_of_range(
    magnitudes: List[Dict[str, Any]], precision: str = 'fp32'
) -> Optional[Dict[str, Any]]:
    """The first module call whose output leaves the normal range.

    Args:
        magnitudes (list[dict]): :attr:`ActivationProbe.magnitudes`.
        precision (str): The replay's precision (``'float16'`` uses the
            fp16 range).

    Returns:
        dict | None: The entry plus ``reason`` (one line),
        ``weights_out_of_range`` (bool) and ``limit``; None when every
        output stays in range.
    """
    limit = range_limit(precision)
    for entry in magnitudes:
        reason = _why(entry, limit)
        if reason is not None:
            weight = entry['weight_max']
            return dict(
                entry,
                reason=reason,
                limit=limit,
                weights_out_of_range=weight is not None
                and weight > WEIGHT_LIMIT,
            )
    return None


def largest_outputs(
    magnitudes: List[Dict[str, Any]], k: int = 5
) -> List[Dict[str, Any]]:
    """The ``k`` module calls with the largest outputs, largest first."""
    known = [m for m in magnitudes if m['out_max'] is not None]
    return sorted(known, key=lambda m: -m['out_max'])[:k]
