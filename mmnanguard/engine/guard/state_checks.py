# Copyright (c) mmnanguard contributors. All rights reserved.
"""The checks of the guard's state read back from a checkpoint.

A checkpoint is data: its ``nanguard`` key is checked value by value
before the guard takes it (``GuardResponder.load_state_dict`` and the
``load_state_dict`` of :class:`~.lr_backoff.LrBackoff` and
:class:`~.spike_detector.SpikeDetector`). A value of the wrong type, a
non-finite number or one out of range raises
:class:`~.exceptions.GuardStateError` naming its key; nothing is clamped
or replaced.
"""

import math
from numbers import Integral, Real
from typing import Any, Dict, List, Optional

from .exceptions import GuardStateError


def state_dict_at(value: Any, key: str) -> Dict[str, Any]:
    """``value`` as the dict it must be.

    Args:
        value: The value read.
        key (str): Its key below ``nanguard`` (``''``: the whole state).

    Returns:
        dict: ``value``.

    Raises:
        GuardStateError: It is not a dict with string keys.
    """
    if not isinstance(value, dict) or not all(
        isinstance(k, str) for k in value
    ):
        raise GuardStateError(key or '<state>', value, 'a dict')
    return value


def count_at(value: Any, key: str) -> int:
    """``value`` as a count: an int >= 0 (not a bool).

    Raises:
        GuardStateError: It is not.
    """
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise GuardStateError(key, value, 'an int >= 0')
    if value < 0:
        raise GuardStateError(key, value, 'an int >= 0')
    return int(value)


def optional_count_at(value: Any, key: str) -> Optional[int]:
    """``value`` as None or a count (:func:`count_at`)."""
    return None if value is None else count_at(value, key)


def number_at(
    value: Any,
    key: str,
    low: float = -math.inf,
    high: float = math.inf,
    low_open: bool = False,
) -> float:
    """``value`` as a finite number in ``[low, high]`` (``(low, high]``
    with ``low_open``).

    Args:
        value: The value read.
        key (str): Its key below ``nanguard``.
        low (float): The smallest value allowed. Defaults to -inf.
        high (float): The largest value allowed. Defaults to inf.
        low_open (bool): Whether ``low`` itself is refused.
            Defaults to False.

    Returns:
        float: ``value``.

    Raises:
        GuardStateError: It is not a real number (a bool is not), not
            finite, or out of the range.
    """
    bounds = '(' if low_open else '['
    expected = f'a finite number in {bounds}{low:g}, {high:g}]'
    if isinstance(value, bool) or not isinstance(value, Real):
        raise GuardStateError(key, value, expected)
    number = float(value)
    if not math.isfinite(number) or number > high:
        raise GuardStateError(key, value, expected)
    if number < low or (low_open and number == low):
        raise GuardStateError(key, value, expected)
    return number


def numbers_at(value: Any, key: str) -> List[float]:
    """``value`` as a list of finite numbers.

    Raises:
        GuardStateError: It is not a list or tuple, or an item is not a
            finite number (named by its index).
    """
    if not isinstance(value, (list, tuple)):
        raise GuardStateError(key, value, 'a list of finite numbers')
    return [number_at(x, f'{key}[{i}]') for i, x in enumerate(value)]


__all__ = [
    'count_at',
    'number_at',
    'numbers_at',
    'optional_count_at',
    'state_dict_at',
]
