# Copyright (c) mmnanguard contributors. All rights reserved.
"""Mend: ``DeepSpeedStrategy`` skips the checkpoint hooks (mmengine <=
0.10.7).

``FlexibleRunner.save_checkpoint`` and ``resume`` hand the strategy a
``callback`` that calls the ``before_save_checkpoint`` and
``after_load_checkpoint`` hooks. ``DeepSpeedStrategy.save_checkpoint`` and
``resume`` accept it and never call it ("not supported yet"), so no hook
stores its state in a DeepSpeed checkpoint or reads it back: ``EMAHook``'s
weights, ``NanGuardHook``'s counters, lr backoff and spike statistics.

The mend calls the callback as the other strategies do: before the write,
with the dict that DeepSpeed saves as its client state (on every rank, as
``DeepSpeedStrategy.save_checkpoint`` runs on every rank); after a resume,
with the client state read back. It does nothing where the strategy's own
methods call the callback; it can go once mmengine's do.
"""

import functools
import inspect
from typing import Any, Callable, Optional

from mmnanguard.function_marks import mark


def _calls_callback(method: Callable) -> bool:
    """Whether ``method``'s source calls its ``callback`` argument."""
    try:
        return 'callback(' in inspect.getsource(method)
    except (OSError, TypeError):
        return True  # no source to read: leave it as it is


def is_needed() -> bool:
    """Whether mmengine imports deepspeed and its ``DeepSpeedStrategy``
    ignores the callback (without deepspeed the strategy cannot run, and
    nothing is mended)."""
    try:
        from mmengine._strategy import deepspeed as strategy_module
    except ImportError:
        return False
    if getattr(strategy_module, 'deepspeed', None) is None:
        return False
    DeepSpeedStrategy = strategy_module.DeepSpeedStrategy
    if getattr(DeepSpeedStrategy.save_checkpoint, '_nanguard', False):
        return False
    return not (
        _calls_callback(DeepSpeedStrategy.save_checkpoint)
        and _calls_callback(DeepSpeedStrategy.resume)
    )


def _save_with_callback(save: Callable) -> Callable:
    @functools.wraps(save)
    def save_checkpoint(
        self,
        filename: str,
        *,
        extra_ckpt: Optional[dict] = None,
        callback: Optional[Callable] = None,
        **kwargs: Any,
    ) -> None:
        if extra_ckpt is None:
            extra_ckpt = dict()
        if callback is not None:
            callback(extra_ckpt)
        return save(self, filename, extra_ckpt=extra_ckpt, **kwargs)

    return mark(save_checkpoint, '_nanguard')


def _resume_with_callback(resume: Callable) -> Callable:
    @functools.wraps(resume)
    def resume_checkpoint(
        self, filename: str, *, callback: Optional[Callable] = None, **kwargs
    ) -> dict:
        extra_ckpt = resume(self, filename, **kwargs)
        if callback is not None:
            callback(extra_ckpt)
        return extra_ckpt

    return mark(resume_checkpoint, '_nanguard')


def apply() -> bool:
    """Apply the mend where needed.

    Returns:
        bool: Whether the strategy's methods were wrapped.
    """
    if not is_needed():
        return False
    from mmengine._strategy.deepspeed import DeepSpeedStrategy

    DeepSpeedStrategy.save_checkpoint = _save_with_callback(
        DeepSpeedStrategy.save_checkpoint
    )
    DeepSpeedStrategy.resume = _resume_with_callback(DeepSpeedStrategy.resume)
    return True
