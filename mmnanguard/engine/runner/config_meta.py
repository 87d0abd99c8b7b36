# Copyright (c) mmnanguard contributors. All rights reserved.
"""A resumed checkpoint's ``meta.config`` is text, never code to run.

mmengine 0.10.7's ``Runner.resume`` (and ``FlexibleRunner.resume``)
builds ``Config.fromstring(checkpoint['meta']['config'], '.py')`` to read
one value, ``gpu_ids``, and ``Config`` evaluates a ``.py`` config: a
crafted checkpoint whose ``meta.config`` holds ``import os;
os.system(...)`` runs it at ``--resume``, after the secure load let the
string through (it is data to the unpickler).

:func:`strip_config_code` runs in the ``after_load_checkpoint`` stage of
the protected runs' ``CheckpointHook``
(:class:`~.durable_checkpoint_hook.DurableCheckpointHook`), after the load
and before ``resume`` reads ``meta``. It replaces ``meta.config`` by the
one line mmengine reads from it, ``gpu_ids = [...]``, taken from the
config's syntax tree (``ast.parse`` and ``ast.literal_eval``: nothing is
run), or removes it when there is no literal ``gpu_ids`` (mmengine then
skips its GPU-count check, as for a checkpoint saved without a config).
"""

import ast
from typing import Any, Dict, Optional

#: The only name mmengine's resume reads from ``meta.config``.
GPU_IDS = 'gpu_ids'


def literal_gpu_ids(text: Any) -> Optional[str]:
    """``'gpu_ids = [...]'`` from the config text ``text``, found in its
    syntax tree without running it; None when there is no top-level
    ``gpu_ids`` assigned a list or tuple of ints.

    Args:
        text: A checkpoint's ``meta.config``.

    Returns:
        str | None: The line, or None.
    """
    if not isinstance(text, str):
        return None
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    for node in tree.body:
        if not (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == GPU_IDS
        ):
            continue
        try:
            value = ast.literal_eval(node.value)
        except (ValueError, TypeError, SyntaxError, RecursionError):
            return None
        if isinstance(value, (list, tuple)) and all(
            isinstance(i, int) and not isinstance(i, bool) for i in value
        ):
            return f'{GPU_IDS} = {list(value)!r}\n'
        return None
    return None


def strip_config_code(checkpoint: Dict[str, Any]) -> None:
    """Replace ``checkpoint['meta']['config']`` by its literal ``gpu_ids``
    line, or remove it (see the module docstring), in place.

    Args:
        checkpoint (dict): A checkpoint just loaded.
    """
    meta = checkpoint.get('meta') if isinstance(checkpoint, dict) else None
    if not isinstance(meta, dict) or 'config' not in meta:
        return
    line = literal_gpu_ids(meta['config'])
    if line is None:
        del meta['config']
    else:
        meta['config'] = line


__all__ = ['GPU_IDS', 'literal_gpu_ids', 'strip_config_code']
