# Copyright (c) mmnanguard contributors. All rights reserved.
"""The protected runners' side of the check before a checkpoint write.

Both protected runners call :func:`agree_before_save` on every rank at the
top of their ``save_checkpoint``, before its master-only part; the check
itself is the guard's (:mod:`mmnanguard.engine.guard.save_agreement`), run
through the runner's ``NanGuardHook``.
"""

from typing import Any, Optional

from ..hooks import NanGuardHook


def guard_hook(runner: Any) -> Optional[NanGuardHook]:
    """The runner's ``NanGuardHook``, or None."""
    for hook in runner.hooks:
        if isinstance(hook, NanGuardHook):
            return hook
    return None


def agree_before_save(runner: Any) -> bool:
    """Check the state about to be saved on every rank, agree, and handle a
    non-finite one on every rank (call it on every rank, before the
    master-only write; :meth:`NanGuardHook.agree_before_save`).

    Args:
        runner: The protected runner.

    Returns:
        bool: Whether an incident was handled (the state was restored, or
        the policy raised before this returns).
    """
    hook = guard_hook(runner)
    return False if hook is None else hook.agree_before_save(runner)
