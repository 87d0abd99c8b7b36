# Copyright (c) mmnanguard contributors. All rights reserved.
"""The one place where the known breakages of the supported stacks are mended.

Each mend names the upstream versions that need it, checks whether it is
needed on the running stack, and does nothing otherwise. They are applied by
``import mmnanguard``, before anything imports mmrotate's models.

=====================================  =====================================
mend                                   needed by
=====================================  =====================================
:mod:`.collections_sequence`           mmrotate 1.0.0rc1 on Python >= 3.10
:mod:`.checkpoint_allowlist`           mmengine <= 0.10.7 on torch >= 2.6
:mod:`.mim_config_scope`               mmengine <= 0.10.7 (``mmnanguard::``)
:mod:`.strict_torch_load`              onedl-mmengine 0.10.12 (unsafe
                                       ``weights_only=False`` fallback)
:mod:`.fork_config_scopes`             onedl-mmsegmentation 1.4.2
                                       (``mmseg::`` config paths)
:mod:`.fsdp1_cpu`                      mmengine <= 0.10.7 ``FSDPStrategy``
                                       (CPU; resume on torch >= 2.1)
:mod:`.deepspeed_optimizers`           mmengine <= 0.10.7 with deepspeed
                                       without the 1-bit optimizers (0.19.8)
:mod:`.deepspeed_checkpoint_hooks`     mmengine <= 0.10.7 with deepspeed
                                       (checkpoint hooks never called)
:mod:`.deepspeed_checkpoint_load`      deepspeed 0.19.8 (every checkpoint
                                       part loaded weights_only=False)
:mod:`.deepspeed_cpu_comm`             deepspeed 0.19.8 on a CPU (a C++ op
                                       compiled at start)
:mod:`.cpu_distributed` (on demand)    mmengine <= 0.10.7, CPU-only torch
:mod:`.elastic_round` (on demand)      torch elastic restarts with the
                                       agent's shared store (torch 2.13)
=====================================  =====================================
"""

from typing import Dict

from . import (
    checkpoint_allowlist,
    collections_sequence,
    deepspeed_checkpoint_hooks,
    deepspeed_checkpoint_load,
    deepspeed_cpu_comm,
    deepspeed_optimizers,
    fork_config_scopes,
    fsdp1_cpu,
    mim_config_scope,
    strict_torch_load,
)

#: name of each mend -> whether :func:`apply_all` applied it in this process.
APPLIED: Dict[str, bool] = {}


def apply_all() -> Dict[str, bool]:
    """Apply every import-time mend that the running stack needs.

    Returns:
        dict: For each mend, whether it was applied (``False`` where the
        running versions do not need it).
    """
    APPLIED['collections_sequence'] = collections_sequence.apply()
    APPLIED['checkpoint_allowlist'] = checkpoint_allowlist.apply()
    APPLIED['mim_config_scope'] = mim_config_scope.apply()
    APPLIED['strict_torch_load'] = strict_torch_load.apply()
    APPLIED['fork_config_scopes'] = fork_config_scopes.apply()
    APPLIED['deepspeed_optimizers'] = deepspeed_optimizers.apply()
    APPLIED['deepspeed_checkpoint_hooks'] = deepspeed_checkpoint_hooks.apply()
    APPLIED['deepspeed_checkpoint_load'] = deepspeed_checkpoint_load.apply()
    APPLIED['deepspeed_cpu_comm'] = deepspeed_cpu_comm.apply()
    APPLIED['fsdp1_cpu'] = fsdp1_cpu.apply()
    return dict(APPLIED)


__all__ = ['apply_all', 'APPLIED']
