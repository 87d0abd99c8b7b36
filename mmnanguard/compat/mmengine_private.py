# Copyright (c) mmnanguard contributors. All rights reserved.
"""Every private field of mmengine that mmnanguard reads or writes, in one
place.

mmengine exposes no public way to ask a :class:`Runner` what it will load
before it loads it, to replace the forward that ``train_step`` calls, to
read an :class:`AmpOptimWrapper`'s static loss scale, or to see the values a
param scheduler wrote. Each accessor below names the field, and the fields
were checked on mmengine 0.10.7 and onedl-mmengine 0.10.12 (the supported
stacks). ``tests/test_compat/test_mmengine_private.py`` builds the real
objects and fails by name when a field is gone; :func:`require` raises the
same error at run time.
"""

from typing import Any, Callable, List, Optional, Tuple

import mmengine

#: The fields, by the class that holds them (for the test and the error).
FIELDS = {
    'Runner': ('_load_from', '_resume', '_has_loaded', '_train_dataloader'),
    'BaseModel': ('_run_forward',),
    'AmpOptimWrapper': ('_scale_update_param',),
    # set on the optim wrapper by the param scheduler that wraps its step
    'OptimWrapper': ('_global_step',),
    '_ParamScheduler': ('_last_value', '_global_step'),
    'FSDPStrategy': ('_is_full_state_dict',),
    'EpochBasedTrainLoop': ('_epoch',),
}


def require(obj: Any, field: str) -> Any:
    """``obj.<field>``, or a :class:`RuntimeError` that names the field and
    the mmengine version when it is gone."""
    try:
        return getattr(obj, field)
    except AttributeError:
        raise RuntimeError(
            f'nanguard: {type(obj).__name__} of mmengine '
            f'{mmengine.__version__} has no {field!r}; mmnanguard was '
            'checked on mmengine 0.10.7 and 0.10.12 '
            '(mmnanguard/compat/mmengine_private.py)'
        ) from None


# -- Runner --------------------------------------------------------------
def load_request(runner: Any) -> Tuple[Optional[str], Any]:
    """What the runner was asked to load: ``(load_from, resume)``."""
    return require(runner, '_load_from'), require(runner, '_resume')


def has_loaded(runner: Any) -> bool:
    """Whether ``load_or_resume`` already ran."""
    return bool(require(runner, '_has_loaded'))


def mark_loaded(runner: Any) -> None:
    """Tell the runner that its checkpoint is loaded (as its own
    ``load_or_resume`` does)."""
    require(runner, '_has_loaded')
    runner._has_loaded = True


def train_dataloader(runner: Any) -> Any:
    """The training dataloader as given (a config dict until built)."""
    return require(runner, '_train_dataloader')


def set_train_dataloader(runner: Any, loader: Any) -> None:
    """Replace the training dataloader (its config, before it is built)."""
    require(runner, '_train_dataloader')
    runner._train_dataloader = loader


# -- BaseModel -----------------------------------------------------------
def run_forward(model: Any) -> Callable[..., Any]:
    """The forward ``train_step``/``val_step`` call: ``(data, mode)``."""
    return require(model, '_run_forward')


def set_run_forward(model: Any, forward: Callable[..., Any]) -> None:
    """Replace :func:`run_forward` on this model instance."""
    require(model, '_run_forward')
    model._run_forward = forward


# -- optim wrappers ------------------------------------------------------
def static_loss_scale(wrapper: Any) -> Optional[float]:
    """An :class:`AmpOptimWrapper`'s static ``loss_scale`` (None: dynamic;
    the value ``GradScaler.update`` is called with)."""
    return require(wrapper, '_scale_update_param')


def count_step(wrapper: Any) -> None:
    """Count one optimizer step as the param schedulers' step counter does
    (``_global_step``, which they read)."""
    wrapper._global_step = require(wrapper, '_global_step') + 1


# -- param schedulers ----------------------------------------------------
def last_values(scheduler: Any) -> List[Any]:
    """The values a param scheduler wrote at its last step (one per param
    group; empty before its first)."""
    return list(getattr(scheduler, '_last_value', None) or [])


def scheduler_steps(scheduler: Any) -> int:
    """How many times a param scheduler stepped."""
    return getattr(scheduler, '_global_step', 0)


# -- FSDPStrategy --------------------------------------------------------
def fsdp_full_state_dict(strategy: Any) -> bool:
    """Whether an ``FSDPStrategy`` saves a full state dict (one file from
    the main process) rather than each rank's shards."""
    return bool(require(strategy, '_is_full_state_dict')())


# -- EpochBasedTrainLoop -------------------------------------------------
def end_loop_epoch(loop: Any) -> None:
    """Count one finished epoch as ``EpochBasedTrainLoop.run_epoch`` does
    after ``after_train_epoch``."""
    loop._epoch = require(loop, '_epoch') + 1
