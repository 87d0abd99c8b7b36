# Copyright (c) mmnanguard contributors. All rights reserved.
"""Mend: ``launcher='pytorch'`` on a CPU-only torch (mmengine <= 0.10.7).

mmengine's ``init_dist`` calls ``torch.cuda.set_device`` unconditionally and
``Runner.wrap_model`` passes ``device_ids=[LOCAL_RANK]`` to DDP, which rejects
CPU modules. On GPUs the stock path works and this mend does nothing.

On a CPU-only torch, :func:`prepare_cpu_distributed` starts the process group
with gloo from torchrun's environment variables *before* the Runner is built
(mmengine then skips its own ``init_dist``) and sets
``model_wrapper_cfg=dict(type='MMDistributedDataParallel', device_ids=None)``
unless the config already has a ``model_wrapper_cfg`` (and the same
``model_wrapper`` on a ``FlexibleRunner``'s ``DDPStrategy``). Under a torch
elastic agent the group starts in a store namespace of the restart round's
own (:mod:`.elastic_round`), so a restarted group never reads the previous
round's gloo addresses. It is called by
``tools/train.py --launcher pytorch``, by the protected runners'
``from_cfg`` (so that an upstream ``tools/train.py`` building them from a
config with the include runs on such a machine too) and by the DDP tests.
"""

import os

import torch
import torch.distributed as torch_dist
from mmengine.config import Config

from .elastic_round import init_process_group


def is_needed(launcher: str) -> bool:
    """Whether ``launcher`` needs the mend on this machine.

    Args:
        launcher (str): The job launcher (``'none'``, ``'pytorch'``, ...).
    """
    return launcher == 'pytorch' and not torch.cuda.is_available()


def prepare_cpu_distributed(cfg: Config, launcher: str) -> bool:
    """Start gloo and adapt ``cfg`` for CPU DDP where needed.

    Args:
        cfg (Config | dict): The training config; ``model_wrapper_cfg`` is
            set on it when it has none.
        launcher (str): The job launcher.

    Returns:
        bool: Whether the mend was applied.

    Raises:
        RuntimeError: ``RANK``/``WORLD_SIZE`` are missing, i.e. the script was
            not started by ``torchrun`` or ``python -m torch.distributed.run``.
    """
    if not is_needed(launcher):
        return False
    missing = [
        k
        for k in ('RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT')
        if k not in os.environ
    ]
    if missing:
        raise RuntimeError(
            f'--launcher pytorch needs the environment variables {missing}; '
            'start the script with `torchrun --nproc_per_node N ...`.'
        )
    if not torch_dist.is_initialized():
        init_process_group('gloo')
    if cfg.get('model_wrapper_cfg') is None:
        cfg['model_wrapper_cfg'] = dict(
            type='MMDistributedDataParallel', device_ids=None
        )
    strategy = cfg.get('strategy')
    if (
        isinstance(strategy, dict)
        and str(strategy.get('type', '')).split('.')[-1] == 'DDPStrategy'
        and strategy.get('model_wrapper') is None
    ):  # FlexibleRunner: the strategy wraps the model
        strategy['model_wrapper'] = dict(
            type='MMDistributedDataParallel', device_ids=None
        )
    return True
