# Copyright (c) mmnanguard contributors. All rights reserved.
"""Durable checkpoint files for protected runs.

mmengine 0.10.7 writes a checkpoint with ``LocalBackend.put``, that is
``open(path, 'wb').write(...)``: a kill or a full disk during the write
leaves a truncated ``iter_k.pth`` under its final name, which ``--resume``
then fails to read. :class:`DurableLocalBackend` is the same local backend
with ``put`` and ``put_text`` going through
:func:`~.durable_file.write_durable` (temporary file in the same folder,
``fsync``, ``os.replace``, folder ``fsync``): a checkpoint file is
complete or absent.

It is registered in mmengine's file-backend registry under
:data:`BACKEND_NAME` (mmengine's own extension point, nothing of mmengine
is replaced), and :meth:`NanGuardRunner.save_checkpoint` selects it with
:func:`durable_backend_args` for every local checkpoint: the ones of
``CheckpointHook`` (periodic and best), of the preemption save and of any
other hook that calls ``runner.save_checkpoint``. Remote ``out_dir``\\ s
(``s3://``, ``petrel://``...), an explicit non-local ``backend_args`` and
the deprecated ``file_client_args`` are passed on unchanged.

Under ``FlexibleRunner`` the strategy writes the checkpoint itself, with
no backend to select. :func:`save_strategy_checkpoint` makes the write of
a strategy that writes one file from the main process
(``SingleDeviceStrategy``, ``DDPStrategy``) durable the same way: the
strategy writes into the temporary file through its descriptor
(``/proc/self/fd/<fd>``, never by the temporary name, which another
process could swap for a link:
:func:`~mmnanguard.fileio.durable_file.write_durable_by`), and the file
is renamed to the checkpoint's name once complete; so is the one file of
``FSDPStrategy`` with a full state dict. ``FSDPStrategy`` with a local
state dict and ``DeepSpeedStrategy`` write a folder that every rank
writes a part of: it is written inside a private temporary folder
(``mkdtemp``), every file synced, and renamed once every rank has written
(:func:`save_in_parts`). Other
strategies (``ColossalAIStrategy``, a subclass's own ``save_checkpoint``)
are left as they are.

Cost: one ``fsync`` of the checkpoint and one of its folder per save (the
data is written once, as before; mmengine already holds the whole
serialized checkpoint in memory before writing it).
"""

import importlib
import os.path as osp
from pathlib import Path
from typing import Any, Callable, List, Optional, Type, Union

import mmengine
from mmengine._strategy import DDPStrategy, SingleDeviceStrategy
from mmengine.dist import barrier, broadcast_object_list, is_main_process
from mmengine.fileio import LocalBackend, register_backend
from mmengine.fileio.backends import backends as registered_backends

from mmnanguard.compat.mmengine_private import fsdp_full_state_dict
from mmnanguard.fileio.durable_file import write_durable, write_durable_by
from mmnanguard.fileio.durable_folder import (
    make_private_folder,
    publish,
    sync_tree,
    written_path,
)

#: The name of :class:`DurableLocalBackend` in mmengine's backend registry.
BACKEND_NAME = 'nanguard_durable_local'


class DurableLocalBackend(LocalBackend):
    """mmengine's ``LocalBackend`` whose writes are complete or absent.

    Reads, ``isfile``, ``remove`` and the rest are ``LocalBackend``'s.
    """

    def put(self, obj: bytes, filepath: Union[str, Path]) -> None:
        """Write ``obj`` to ``filepath`` durably (folder created if
        missing).

        Args:
            obj (bytes): The data.
            filepath (str | Path): The final file name.

        Raises:
            DurableWriteError: The write failed; ``filepath`` is unchanged.
        """
        filepath = str(filepath)
        mmengine.mkdir_or_exist(osp.dirname(filepath))
        write_durable(filepath, obj)

    def put_text(
        self, obj: str, filepath: Union[str, Path], encoding: str = 'utf-8'
    ) -> None:
        """Write the text ``obj`` to ``filepath`` durably.

        Args:
            obj (str): The text.
            filepath (str | Path): The final file name.
            encoding (str): The text encoding. Defaults to ``'utf-8'``.
        """
        self.put(obj.encode(encoding), filepath)


if BACKEND_NAME not in registered_backends:
    register_backend(BACKEND_NAME, DurableLocalBackend)


def is_local(path: Union[str, Path]) -> bool:
    """Whether ``path`` is a local path (no ``scheme://`` prefix)."""
    return '://' not in str(path)


def durable_backend_args(
    out_dir: Union[str, Path],
    backend_args: Optional[dict] = None,
    file_client_args: Optional[dict] = None,
) -> Optional[dict]:
    """The ``backend_args`` that make ``Runner.save_checkpoint`` durable.

    Args:
        out_dir (str | Path): The checkpoint folder.
        backend_args (dict, optional): What the caller passed.
        file_client_args (dict, optional): What the caller passed
            (deprecated in mmengine; left to mmengine when set).

    Returns:
        dict | None: ``{'backend': BACKEND_NAME}`` for a local folder with
        no backend or the ``'local'`` one; ``backend_args`` unchanged
        otherwise.
    """
    if file_client_args is not None or not is_local(out_dir):
        return backend_args
    if backend_args is None or dict(backend_args) == {'backend': 'local'}:
        return {'backend': BACKEND_NAME}
    return backend_args


#: The strategies' ``save_checkpoint`` methods that write one file, from
#: the main process only.
_ONE_FILE_SAVES = (
    SingleDeviceStrategy.save_checkpoint,
    DDPStrategy.save_checkpoint,
)


def _strategy_class(module: str, name: str) -> Optional[Type[Any]]:
    """mmengine's strategy ``name``, or None where it cannot be imported
    (``DeepSpeedStrategy`` imports without deepspeed)."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def _own_save_of(strategy: Any, module: str, name: str) -> bool:
    """Whether ``strategy`` saves with mmengine's ``name`` strategy's own
    ``save_checkpoint`` (as mended; not a subclass's own)."""
    cls = _strategy_class(module, name)
    strategy_cls: Type[Any] = type(strategy)
    return (
        cls is not None
        and isinstance(strategy, cls)
        and strategy_cls.save_checkpoint is cls.save_checkpoint
    )


def _fsdp_full(strategy: Any) -> bool:
    return _own_save_of(
        strategy, 'mmengine._strategy.fsdp', 'FSDPStrategy'
    ) and fsdp_full_state_dict(strategy)


def writes_one_file(strategy: Any) -> bool:
    """Whether ``strategy`` saves a checkpoint as one file written by the
    main process: ``SingleDeviceStrategy``'s or ``DDPStrategy``'s
    ``save_checkpoint``, or ``FSDPStrategy``'s with a full state dict (not
    a subclass's own)."""
    return type(strategy).save_checkpoint in _ONE_FILE_SAVES or _fsdp_full(
        strategy
    )


def writes_shards(strategy: Any) -> bool:
    """Whether ``strategy`` saves a checkpoint as a folder that every rank
    writes a part of: ``FSDPStrategy`` with a local (sharded) state dict,
    ``DeepSpeedStrategy`` (not a subclass's own ``save_checkpoint``)."""
    fsdp = _own_save_of(strategy, 'mmengine._strategy.fsdp', 'FSDPStrategy')
    return (fsdp and not fsdp_full_state_dict(strategy)) or _own_save_of(
        strategy, 'mmengine._strategy.deepspeed', 'DeepSpeedStrategy'
    )


def save_in_parts(save: Callable[[str], None], path: str) -> None:
    """``save(name)`` on every rank, ``name`` being ``path``'s name inside
    a private folder that the main process made; published under
    ``path`` once every rank has written and synced its parts
    (:mod:`mmnanguard.fileio.durable_folder`).

    One broadcast (the private folder's name, made before any rank
    writes) and two barriers: every part is synced before the rename, and
    the rename is done before any rank goes on (a resume or a rollback
    reads ``path``).

    Args:
        save (callable): Saves the checkpoint under the name given.
        path (str): The checkpoint's final name.
    """
    private: List[Optional[str]] = [None]
    if is_main_process():
        mmengine.mkdir_or_exist(osp.dirname(path))
        private = [make_private_folder(path)]
    broadcast_object_list(private)
    folder = private[0]
    if folder is None:
        raise RuntimeError(
            f'no private folder was broadcast for the checkpoint {path}'
        )
    written = written_path(folder, path)
    save(written)
    sync_tree(written)
    barrier()
    if is_main_process():
        publish(folder, path)
    barrier()


def save_strategy_checkpoint(
    save: Callable[[str], None],
    strategy: Any,
    out_dir: str,
    filename: str,
    backend_args: Optional[dict] = None,
    file_client_args: Optional[dict] = None,
) -> None:
    """``save(name)`` (``FlexibleRunner.save_checkpoint`` with the file
    name ``name`` in ``out_dir``), durable where it can be: a local
    one-file checkpoint is written under a temporary name and renamed to
    ``filename`` once complete (by the main process, which writes it); a
    local checkpoint that every rank writes a part of is written inside a
    private temporary folder, synced and renamed once every rank has
    written (:func:`save_in_parts`).

    Args:
        save (callable): Saves the checkpoint under the name given (an
            absolute path, which ``FlexibleRunner`` takes as it is).
        strategy (BaseStrategy): The runner's strategy.
        out_dir (str): The checkpoint folder.
        filename (str): The checkpoint's file name.
        backend_args (dict, optional): What the caller passed.
        file_client_args (dict, optional): What the caller passed.

    Raises:
        DurableWriteError: The write failed; no file of that name was
            written.
    """
    durable = durable_backend_args(out_dir, backend_args, file_client_args)
    if durable != {'backend': BACKEND_NAME}:
        save(filename)
        return
    if writes_shards(strategy):
        save_in_parts(save, osp.join(out_dir, filename))
        return
    if not writes_one_file(strategy) or not is_main_process():
        save(filename)  # the main process writes; the others pass
        return
    mmengine.mkdir_or_exist(out_dir)
    # an absolute name: FlexibleRunner joins it to out_dir as it is
    write_durable_by(osp.join(out_dir, filename), save)


__all__ = [
    'BACKEND_NAME',
    'save_in_parts',
    'save_strategy_checkpoint',
    'writes_one_file',
    'writes_shards',
    'DurableLocalBackend',
    'durable_backend_args',
    'is_local',
]
