# Copyright (c) mmnanguard contributors. All rights reserved.
"""The parts that ``NanGuardHook.before_train`` builds (the step guard, the
incident recorder), read by whoever uses them afterwards."""

from typing import Optional, TypeVar

T = TypeVar('T')


def started(part: Optional[T], name: str) -> T:
    """``part``, built when training started.

    Args:
        part (object, optional): The part, None before ``before_train``.
        name (str): Its name, for the error.

    Returns:
        object: ``part``.

    Raises:
        RuntimeError: When ``part`` was not built yet.
    """
    if part is None:
        raise RuntimeError(
            f'nanguard: {name} is used before training started '
            '(NanGuardHook.before_train builds it)'
        )
    return part
