# Copyright (c) mmnanguard contributors. All rights reserved.
"""Mend: DeepSpeed's CPU backend compiles a C++ op at every new machine.

On a machine without a GPU deepspeed (0.19.8) selects its CPU accelerator,
and its torch communication backend (``deepspeed/comm/torch.py``,
``TorchBackend.__init__``) builds the shared-memory op
``deepspeed_shm_comm`` when the process group starts: a JIT compile with
the C++ compiler and ninja (about 4 minutes on 2 cores, cached under
``TORCH_EXTENSIONS_DIR``, by default ``~/.cache/torch_extensions``), and a
``RuntimeError`` where ninja is missing. The op serves only
``inference_all_reduce``; training (``deepspeed.initialize``, ZeRO's
reductions, the checkpoints) goes through ``torch.distributed`` (gloo).

The mend makes the backend start without the op (``build_shm_op``, looked
up by name, returns None, as it does where the op is not compatible) on
the CPU accelerator when the op was not installed prebuilt. It does
nothing on a GPU, where no such op is built, or where deepspeed is absent.
"""

import importlib
import importlib.util
from typing import Any, Optional

from mmnanguard.function_marks import mark


def _torch_comm() -> Optional[Any]:
    """deepspeed's ``comm.torch`` module, or None without deepspeed."""
    if importlib.util.find_spec('deepspeed') is None:
        return None
    # by its full name: ``deepspeed.comm`` binds ``torch`` (the package)
    return importlib.import_module('deepspeed.comm.torch')


def is_needed() -> bool:
    """Whether deepspeed would compile the shared-memory op at start."""
    torch_comm = _torch_comm()
    if torch_comm is None or getattr(
        torch_comm.build_shm_op, '_nanguard', False
    ):
        return False
    from deepspeed.accelerator import get_accelerator
    from deepspeed.git_version_info import installed_ops

    return get_accelerator()._name == 'cpu' and not installed_ops.get(
        'deepspeed_shm_comm', False
    )


def build_shm_op() -> None:
    """Start without the shared-memory op (used by inference only)."""
    return None


mark(build_shm_op, '_nanguard')


def apply() -> bool:
    """Apply the mend where needed.

    Returns:
        bool: Whether the op is left out.
    """
    torch_comm = _torch_comm()
    if torch_comm is None or not is_needed():
        return False
    torch_comm.build_shm_op = build_shm_op
    return True
