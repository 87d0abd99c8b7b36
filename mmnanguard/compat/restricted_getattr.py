# Copyright (c) mmnanguard contributors. All rights reserved.
"""A stand-in for ``builtins.getattr`` in ``weights_only`` unpickling.

Pickle protocol 2 stores a function whose qualified name is dotted (a
method such as ``HistoryBuffer.mean``) as ``getattr(HistoryBuffer,
'mean')``. Allowlisting ``builtins.getattr`` itself gives a crafted file
every attribute of every object it can reach: a function's
``__globals__``, a class-wide dict, a module. :class:`RestrictedGetattr`
is registered under the name ``builtins.getattr`` instead and resolves
only the exact ``(object, name)`` pairs it is given.
"""

import pickle
from typing import Any, Iterable, Tuple


class RestrictedGetattr:
    """``getattr`` for a fixed set of ``(object, name)`` pairs only.

    Args:
        pairs (Iterable[tuple]): ``(obj, name)``; ``obj`` is compared by
            identity.

    Example:
        >>> lookup = RestrictedGetattr([(HistoryBuffer, 'mean')])
        >>> lookup(HistoryBuffer, 'mean') is HistoryBuffer.mean
        True
        >>> lookup(HistoryBuffer, '_statistics_methods')
        Traceback (most recent call last):
        UnpicklingError: the call getattr(HistoryBuffer, ...) is not ...
    """

    def __init__(self, pairs: Iterable[Tuple[Any, str]]) -> None:
        self._pairs = tuple(pairs)

    @property
    def pairs(self) -> Tuple[Tuple[Any, str], ...]:
        """The allowed ``(obj, name)`` pairs."""
        return self._pairs

    def __call__(self, obj: Any, name: Any, *default: Any) -> Any:
        """``getattr(obj, name)`` when the pair is allowed.

        Raises:
            pickle.UnpicklingError: The pair is not allowed, or a default
                was given. The message names the object and the name.
        """
        allowed = (
            not default
            and type(name) is str
            and any(
                obj is owner and name == attr for owner, attr in self._pairs
            )
        )
        if not allowed:
            listed = ', '.join(
                f'{_describe(owner)}.{attr}' for owner, attr in self._pairs
            )
            raise pickle.UnpicklingError(
                f'the call getattr({_describe(obj)}, {name!r}'
                f'{", ..." if default else ""}) is not on the allowlist '
                f'(allowed: {listed or "none"})'
            )
        return getattr(obj, name)

    def __repr__(self) -> str:
        return f'{type(self).__name__}({len(self._pairs)} pairs)'


def _describe(obj: Any) -> str:
    """A short name of ``obj`` that calls nothing of ``obj`` itself."""
    if isinstance(obj, type):
        return f'{obj.__module__}.{obj.__qualname__}'
    return f'<{type(obj).__module__}.{type(obj).__qualname__} object>'
