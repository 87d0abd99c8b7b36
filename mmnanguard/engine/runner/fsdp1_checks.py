# Copyright (c) mmnanguard contributors. All rights reserved.
"""Refuse at start what a protected FSDP1 run could not load later.

mmengine's ``FSDPStrategy`` writes, with ``state_dict_cfg='local'`` (its
default), one file per rank (``iter_N.pth/rank{R}.pth``) holding that
rank's ``ShardedTensor`` shards. mmengine's checkpoint loader, allowlisted
for ``weights_only`` loading (:mod:`mmnanguard.compat.checkpoint_allowlist`),
refuses the pickled ``ShardedTensor``. A rollback from a checkpoint, a
resume or a ``load_from`` would therefore fail in the middle of the run
(or fall back in silence); the protected runner refuses them when it is
built, with the fix. Training itself, its checks (each rank its shards),
skips and rollbacks from memory work with local state dicts.
"""

from typing import Any, List

from mmnanguard.compat.mmengine_private import load_request

from ..guard.fsdp1_state import writes_full_state

try:
    from mmengine._strategy.fsdp import FSDPStrategy
except ImportError:  # pragma: no cover (torch < 2.0: no FSDPStrategy)
    FSDPStrategy = None


def unloadable_uses(runner: Any) -> List[str]:
    """What the run would load from local FSDP1 checkpoints.

    Args:
        runner: The protected ``FlexibleRunner``, its strategy built.

    Returns:
        list[str]: The settings that load a checkpoint (empty when the
        strategy is not ``FSDPStrategy``, writes full state dicts, or
        nothing is loaded).
    """
    strategy = getattr(runner, 'strategy', None)
    if FSDPStrategy is None or not isinstance(strategy, FSDPStrategy):
        return []
    if writes_full_state(strategy):
        return []
    uses = []
    if runner.protection.guard.get('rollback_source') == 'checkpoint':
        uses.append("nanguard.rollback_source='checkpoint'")
    load_from, resume = load_request(runner)
    if resume:
        uses.append(f'resume={resume!r}')
    if load_from is not None:
        uses.append(f'load_from={load_from!r}')
    return uses


def check_fsdp1_checkpoints(runner: Any) -> None:
    """Raise when a protected ``FSDPStrategy`` run writes local checkpoints
    and would load one.

    Args:
        runner: The protected ``FlexibleRunner``, its strategy built.

    Raises:
        ValueError: Naming the settings, the config file and the fix.
    """
    if not runner.protection.enabled:
        return
    uses = unloadable_uses(runner)
    if not uses:
        return
    config = getattr(getattr(runner, 'cfg', None), 'filename', None)
    raise ValueError(
        f'nanguard: {", ".join(uses)} with FSDPStrategy writing local '
        "checkpoints (state_dict_cfg='local', mmengine's default, or a "
        'LOCAL/SHARDED state_dict_type) in '
        f'{config or "the config"}: each rank writes its ShardedTensor '
        'shards (iter_N.pth/rank{R}.pth), which mmengine\'s checkpoint '
        'loader (weights_only, allowlisted) refuses, so the run would fail '
        "when it loads one. Set strategy=dict(type='FSDPStrategy', "
        "state_dict_cfg='full', ...) (rank 0 writes the full state; every "
        "rank loads it through FSDP's state-dict API), or keep the local "
        "layout with nanguard.rollback_source='memory' and without resume "
        'or load_from.'
    )
