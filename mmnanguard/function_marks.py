# Copyright (c) mmnanguard contributors. All rights reserved.
"""The marks a patch leaves on the functions it installs, so that it knows
its own work when it runs again (``getattr(function, name, False)``)."""

from typing import Any, Callable, TypeVar

F = TypeVar('F', bound=Callable[..., Any])


def mark(function: F, name: str) -> F:
    """Set ``function.<name>`` to True.

    Args:
        function (Callable): The function installed.
        name (str): The mark.

    Returns:
        Callable: ``function`` itself.
    """
    setattr(function, name, True)
    return function
