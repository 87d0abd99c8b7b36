# Copyright (c) mmnanguard contributors. All rights reserved.
"""Mend: mmengine's ``FSDPStrategy`` (torch FSDP1) on the CPU, and its
resume (mmengine <= 0.10.7, torch >= 2.1; checked on torch 2.13).

Three things break ``FlexibleRunner`` + ``FSDPStrategy``:

* ``_wrap_model`` passes ``device_id=int(LOCAL_RANK)``, a CUDA device
  index: without an accelerator FSDP raises ``Cannot access accelerator
  device`` (or ``FSDP needs a non-CPU accelerator device``). Where mmengine
  finds no accelerator (``get_device() == 'cpu'``), the wrapper is built
  with ``device_id='cpu'`` unless its config names a ``device_id``.
* ``state_dict_cfg='full'`` hard-codes ``offload_to_cpu=True`` in the
  model's ``FullStateDictConfig``; on the CPU, FSDP's full-state-dict hook
  then crashes rank 0 (SIGSEGV) at the first checkpoint. Offloading to the
  CPU from the CPU moves nothing, so on the CPU the flag is turned off
  (the state dict is the same).
* ``load_optim_state_dict`` calls ``FSDP.optim_state_dict_to_load(
  state_dict, model, optimizer)``, but torch >= 2.1 takes ``(model, optim,
  optim_state_dict)``: every resume fails with ``TypeError: unhashable type:
  'dict'``, on any device. The call is made in torch's order when torch's
  signature starts with ``model``.

On a machine with an accelerator the first two do nothing; the third only
where torch's signature needs it. It can go once mmengine's
``FSDPStrategy`` does these itself.
"""

import inspect
from typing import Any, Callable, Optional

from mmengine.device import get_device

from mmnanguard.function_marks import mark

try:
    from mmengine._strategy.fsdp import FSDP, FSDPStrategy
except ImportError:  # pragma: no cover (torch < 2.0: no FSDPStrategy)
    FSDP = FSDPStrategy = None

#: The wrapper mmengine builds when ``model_wrapper`` is None.
DEFAULT_WRAPPER = 'MMFullyShardedDataParallel'


def on_cpu() -> bool:
    """Whether mmengine places models on the CPU (no accelerator found)."""
    return get_device() == 'cpu'


def optim_load_order_wrong() -> bool:
    """Whether torch's ``FSDP.optim_state_dict_to_load`` takes the model
    first, so that mmengine's ``(state_dict, model, optimizer)`` call
    fails."""
    if FSDP is None:
        return False
    params = list(inspect.signature(FSDP.optim_state_dict_to_load).parameters)
    return params[:3] == ['model', 'optim', 'optim_state_dict']


def cpu_wrap_model(original: Callable) -> Callable:
    """``FSDPStrategy._wrap_model`` that builds the wrapper with
    ``device_id='cpu'`` where mmengine finds no accelerator.

    Args:
        original (Callable): mmengine's ``_wrap_model``.
    """

    def _wrap_model(self, model: Any) -> Any:
        if on_cpu():
            wrapper = dict(self.model_wrapper or dict(type=DEFAULT_WRAPPER))
            wrapper.setdefault('device_id', 'cpu')
            self.model_wrapper = wrapper
        return original(self, model)

    return mark(_wrap_model, 'nanguard_mended')


def cpu_state_dict_cfg(original: Callable) -> Callable:
    """``FSDPStrategy._init_state_dict_cfg`` that turns ``offload_to_cpu``
    off in the model's full state-dict config on the CPU.

    Args:
        original (Callable): mmengine's ``_init_state_dict_cfg``.
    """

    def _init_state_dict_cfg(self, state_dict_cfg: Any) -> None:
        original(self, state_dict_cfg)
        config = self.state_dict_config
        if on_cpu() and getattr(config, 'offload_to_cpu', False):
            config.offload_to_cpu = False

    return mark(_init_state_dict_cfg, 'nanguard_mended')


def load_optim_state_dict(self, state_dict: dict) -> None:
    """``FSDPStrategy.load_optim_state_dict`` with torch's argument order.

    Args:
        state_dict (dict): The optimizer state dict, in the layout of
            :meth:`FSDPStrategy.optim_state_dict`.
    """
    optim_state_dict = FSDP.optim_state_dict_to_load(
        self.model, self.optim_wrapper.optimizer, state_dict
    )
    self.optim_wrapper.load_state_dict(optim_state_dict)


mark(load_optim_state_dict, 'nanguard_mended')


def _mended(function: Optional[Callable]) -> bool:
    return getattr(function, 'nanguard_mended', False)


def apply() -> bool:
    """Mend ``FSDPStrategy`` (once).

    Returns:
        bool: Whether a mend was applied (the CPU ones are always in
        place where ``FSDPStrategy`` exists; they act on the CPU only).
    """
    if FSDPStrategy is None:
        return False
    if not _mended(FSDPStrategy._wrap_model):
        FSDPStrategy._wrap_model = cpu_wrap_model(FSDPStrategy._wrap_model)
    if not _mended(FSDPStrategy._init_state_dict_cfg):
        FSDPStrategy._init_state_dict_cfg = cpu_state_dict_cfg(
            FSDPStrategy._init_state_dict_cfg
        )
    if optim_load_order_wrong():
        FSDPStrategy.load_optim_state_dict = load_optim_state_dict
    return True


__all__ = ['apply', 'on_cpu', 'optim_load_order_wrong']
