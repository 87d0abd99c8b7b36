# Copyright (c) mmnanguard contributors. All rights reserved.
"""The unpickling stand-in for mmengine's :class:`HistoryBuffer`.

mmengine 0.10.7 pickles a ``HistoryBuffer`` with its class-wide
``_statistics_methods`` (``{'mean': HistoryBuffer.mean, ...}``, stored as
``getattr(HistoryBuffer, 'mean')``) and its ``__setstate__`` merges that
dict into the class: a checkpoint can replace ``mean`` of every buffer in
the process. :class:`CheckedHistoryBuffer` is allowlisted under the name
``mmengine.logging.history_buffer.HistoryBuffer`` instead of the class
itself. Its ``__setstate__`` accepts exactly a buffer's state (the two
histories as numpy arrays, an integer ``max_length``, and each of the four
built-in statistics mapped to the method of the same name), hands it to
``HistoryBuffer.__setstate__``, and turns the object into a plain
``HistoryBuffer``: what the checkpoint yields, and what the next checkpoint
saves, is mmengine's class.
"""

import numbers
import pickle
from typing import Any, List, Tuple

import numpy as np
from mmengine.logging.history_buffer import HistoryBuffer

#: The statistics every ``HistoryBuffer`` registers on the class.
STATISTICS_METHODS = ('current', 'max', 'mean', 'min')
#: The keys of a pickled buffer's state.
STATE_KEYS = frozenset(
    ('max_length', '_log_history', '_count_history', 'statistics_methods')
)
#: The dotted name under which mmengine checkpoints reference the class.
PICKLED_NAME = 'mmengine.logging.history_buffer.HistoryBuffer'


class CheckedHistoryBuffer(HistoryBuffer):
    """A :class:`HistoryBuffer` whose unpickled state is checked first.

    The unpickler creates it with ``NEWOBJ`` (``__new__``, no
    ``__init__``) and restores it with ``BUILD`` (``__setstate__``); a file
    that calls it instead is refused.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise pickle.UnpicklingError(
            'a pickled HistoryBuffer is restored by NEWOBJ and BUILD; '
            'this file calls it instead'
        )

    def __setstate__(self, state: Any) -> None:
        """Check ``state``, restore it, become a plain ``HistoryBuffer``.

        Raises:
            pickle.UnpicklingError: ``state`` is not a buffer's state; the
                message names the key or value.
        """
        check_state(state)
        HistoryBuffer.__setstate__(self, dict(state))
        self.__class__ = HistoryBuffer


def check_state(state: Any) -> None:
    """Raise unless ``state`` is what ``HistoryBuffer.__getstate__`` gives.

    Raises:
        pickle.UnpicklingError: Naming what is wrong.
    """
    if type(state) is not dict:
        raise pickle.UnpicklingError(
            f'a HistoryBuffer state must be a dict, got {type(state)}'
        )
    extra = sorted(str(key) for key in set(state) - STATE_KEYS)
    if extra:
        raise pickle.UnpicklingError(
            f'a HistoryBuffer state has the unexpected keys {extra}; '
            f'expected only {sorted(STATE_KEYS)}'
        )
    for name in ('_log_history', '_count_history'):
        if type(state.get(name)) is not np.ndarray:
            raise pickle.UnpicklingError(
                f'a HistoryBuffer state has {name} of type '
                f'{type(state.get(name))}; expected a numpy array'
            )
    max_length = state.get('max_length')
    if not isinstance(max_length, numbers.Integral) or isinstance(
        max_length, bool
    ):
        raise pickle.UnpicklingError(
            'a HistoryBuffer state has max_length of type '
            f'{type(max_length)}; expected an integer'
        )
    _check_methods(state.get('statistics_methods', {}))


def _check_methods(methods: Any) -> None:
    if type(methods) is not dict:
        raise pickle.UnpicklingError(
            'a HistoryBuffer state has statistics_methods of type '
            f'{type(methods)}; expected a dict'
        )
    for key, method in methods.items():
        if key not in STATISTICS_METHODS or method is not getattr(
            HistoryBuffer, key
        ):
            raise pickle.UnpicklingError(
                'a HistoryBuffer state maps the statistics method '
                f'{key!r} to {method!r}; only the built-in '
                f'{list(STATISTICS_METHODS)}, each to the HistoryBuffer '
                'method of the same name, are accepted'
            )


def getattr_pairs() -> List[Tuple[Any, str]]:
    """The ``getattr`` calls a pickled buffer makes, and no others.

    In the file ``HistoryBuffer`` resolves to this stand-in, so the pairs
    are ``(CheckedHistoryBuffer, 'mean')`` and so on; each returns the
    function ``HistoryBuffer.mean`` itself.
    """
    return [(CheckedHistoryBuffer, name) for name in STATISTICS_METHODS]


def safe_global_entries() -> List[Tuple[Any, str]]:
    """``(stand-in, 'mmengine.logging.history_buffer.HistoryBuffer')``."""
    return [(CheckedHistoryBuffer, PICKLED_NAME)]
