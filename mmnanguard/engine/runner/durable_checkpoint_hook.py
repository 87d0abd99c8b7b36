# Copyright (c) mmnanguard contributors. All rights reserved.
"""``CheckpointHook`` with a durable ``last_checkpoint`` and removal of old
checkpoints only after the new one is durable.

Targets mmengine 0.10.7's ``CheckpointHook._save_checkpoint_with_step``,
which (1) with ``max_keep_ckpts`` removes the oldest kept checkpoint
*before* writing the new one, so that a kill or a full disk during the
save leaves no complete checkpoint at all with ``max_keep_ckpts=1``, and
(2) writes ``last_checkpoint`` in place with ``open(..., 'w')``, so that a
kill between truncating and writing it leaves it empty and ``--resume``
stops with ``FileNotFoundError:  can not be found.``.

:class:`DurableCheckpointHook` overrides that one method, keeping
mmengine's bookkeeping (``keep_ckpt_ids`` and ``last_ckpt`` in the message
hub, updated before the save so that the checkpoint holds them) and
changing the order of the file operations:

1. save the checkpoint through ``runner.save_checkpoint`` (durable under
   :class:`NanGuardRunner`: :mod:`.durable_checkpoint`);
2. write ``last_checkpoint`` naming it with
   :func:`~.durable_file.write_durable`;
3. only then remove the checkpoints that ``max_keep_ckpts`` lets go.

A failed save (a full disk) restores the bookkeeping and removes nothing.
A kill between 2 and 3 leaves one old checkpoint more on disk, which
nothing removes later. ``NanGuardRunner`` turns the config's
``CheckpointHook`` into this class (:meth:`DurableCheckpointHook.adopt`);
every other setting of the hook is kept. The best-checkpoint save
(``save_best``) is mmengine's: its files are durable, but the previous
best is removed before the new best is written.

Every removal the hook makes (the rotation, the resumed ``keep_ckpt_ids``
in ``before_train``, the previous best of ``save_best``) goes through
:func:`~.checkpoint_removal.remove_checkpoint_file`, which removes only a
regular file of a checkpoint's name directly in ``out_dir``, or a
checkpoint folder (DeepSpeed) of such a name holding only regular files;
anything else is kept, with a warning. A loaded checkpoint's
``meta.config`` is cut to its literal ``gpu_ids`` before mmengine's
resume evaluates it (:mod:`.config_meta`). Check the overrides again
when moving past mmengine 0.10.x.
"""

import copy
import os.path as osp
from collections import deque
from typing import Any, List, Optional

from mmengine.dist import is_main_process
from mmengine.hooks import CheckpointHook

from mmnanguard.fileio.durable_file import write_durable

from .checkpoint_removal import CheckpointRemovalBackend, checkpoint_names
from .config_meta import strip_config_code


class DurableCheckpointHook(CheckpointHook):
    """mmengine's ``CheckpointHook``, with the file operations reordered.

    Constructed like ``CheckpointHook`` (same arguments); the runner
    usually converts the configured hook with :meth:`adopt`.
    """

    #: mmengine's file backend (untyped); a
    #: :class:`~.checkpoint_removal.CheckpointRemovalBackend` from
    #: ``before_train`` on.
    file_backend: Any
    #: The path of the latest checkpoint saved; None before the first.
    last_ckpt: Optional[str]

    @classmethod
    def adopt(cls, hook: CheckpointHook) -> bool:
        """Turn an mmengine ``CheckpointHook`` into this class in place.

        Only a hook of exactly ``CheckpointHook`` is converted (the
        subclass adds no state); a user's own subclass is left as it is.

        Args:
            hook (CheckpointHook): A built hook.

        Returns:
            bool: Whether ``hook`` is (now) a :class:`DurableCheckpointHook`.
        """
        if isinstance(hook, cls):
            return True
        if type(hook) is not CheckpointHook:
            return False
        hook.__class__ = cls
        return True

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        """Keep mmengine's resume from running ``meta.config`` as Python
        (:func:`~.config_meta.strip_config_code`).

        Args:
            runner (Runner): The runner.
            checkpoint (dict): The checkpoint just loaded.
        """
        strip_config_code(checkpoint)

    def before_train(self, runner) -> None:
        """mmengine's ``before_train``, then every removal of the hook made
        through :func:`~.checkpoint_removal.remove_checkpoint_file`: the
        file backend becomes a
        :class:`~.checkpoint_removal.CheckpointRemovalBackend`, and the
        resumed ``keep_ckpt_ids`` beyond ``max_keep_ckpts`` are removed
        through it here (mmengine would remove them with the plain
        backend, ``rmtree`` included).

        Args:
            runner (Runner): The runner.
        """
        hub = runner.message_hub
        resumed = hub.pop_info('keep_ckpt_ids')
        super().before_train(runner)
        self.file_backend = CheckpointRemovalBackend(
            self.file_backend,
            self.out_dir,
            checkpoint_names(self.filename_tmpl),
        )
        if resumed is None:
            return
        ids = list(resumed)
        if self.max_keep_ckpts > 0:
            while len(ids) > self.max_keep_ckpts:
                step = ids.pop(0)
                if is_main_process():
                    self._remove_checkpoint(runner, step)
            self.keep_ckpt_ids = deque(ids, self.max_keep_ckpts)
        hub.update_info('keep_ckpt_ids', ids)

    def _save_checkpoint_with_step(self, runner, step: int, meta: dict):
        """Save, write ``last_checkpoint``, then remove outdated ones.

        Args:
            runner (Runner): The runner.
            step (int): The epoch or iteration number in the file name.
            meta (dict): Merged into the checkpoint's ``meta``.
        """
        before = (
            copy.copy(getattr(self, 'keep_ckpt_ids', None)),
            runner.message_hub.get_info('keep_ckpt_ids'),
            self.last_ckpt,
            runner.message_hub.get_info('last_ckpt'),
        )
        outdated: List[int] = []
        if self.max_keep_ckpts > 0 and not (
            len(self.keep_ckpt_ids) > 0 and self.keep_ckpt_ids[-1] == step
        ):
            if len(self.keep_ckpt_ids) == self.max_keep_ckpts:
                outdated.append(self.keep_ckpt_ids.popleft())
            self.keep_ckpt_ids.append(step)
            runner.message_hub.update_info(
                'keep_ckpt_ids', list(self.keep_ckpt_ids)
            )
        ckpt_filename = self.filename_tmpl.format(step)
        self.last_ckpt = self.file_backend.join_path(
            self.out_dir, ckpt_filename
        )
        runner.message_hub.update_info('last_ckpt', self.last_ckpt)
        try:
            runner.save_checkpoint(
                self.out_dir,
                ckpt_filename,
                self.file_client_args,
                save_optimizer=self.save_optimizer,
                save_param_scheduler=self.save_param_scheduler,
                meta=meta,
                by_epoch=self.by_epoch,
                backend_args=self.backend_args,
                **self.args,
            )
        except BaseException:
            self._restore(runner, *before)
            raise
        if not is_main_process():
            return
        write_last_checkpoint(runner.work_dir, self.last_ckpt)
        for old in outdated:
            self._remove_checkpoint(runner, old)

    def save_at_boundary(
        self, runner, step: int, meta: dict, by_epoch: bool
    ) -> str:
        """Save the state at the current boundary (the preemption save),
        unless this hook has just saved it, and name it in
        ``last_checkpoint``.

        Args:
            runner (Runner): The runner.
            step (int): The epoch (``by_epoch``) or iteration number.
            meta (dict): The checkpoint's ``epoch`` and ``iter``.
            by_epoch (bool): Whether the boundary is the end of an epoch.

        Returns:
            str: The checkpoint path: the hook's own file name (and
            ``max_keep_ckpts`` rotation) when ``by_epoch`` is the hook's,
            else ``epoch_<step>.pth`` / ``iter_<step>.pth`` outside the
            rotation.
        """
        if by_epoch == self.by_epoch:
            target = self.file_backend.join_path(
                self.out_dir, self.filename_tmpl.format(step)
            )
            if self.last_ckpt != target:
                self._save_checkpoint_with_step(runner, step, meta)
            return target
        unit = 'epoch' if by_epoch else 'iter'
        return self._save_extra(runner, f'{unit}_{step}.pth', meta, by_epoch)

    def _save_extra(
        self, runner, filename: str, meta: dict, by_epoch: bool
    ) -> str:
        path = self.file_backend.join_path(self.out_dir, filename)
        previous = self.last_ckpt, runner.message_hub.get_info('last_ckpt')
        self.last_ckpt = path
        runner.message_hub.update_info('last_ckpt', path)
        try:
            runner.save_checkpoint(
                self.out_dir,
                filename,
                self.file_client_args,
                save_optimizer=self.save_optimizer,
                save_param_scheduler=self.save_param_scheduler,
                meta=meta,
                by_epoch=by_epoch,
                backend_args=self.backend_args,
                **self.args,
            )
        except BaseException:
            self.last_ckpt = previous[0]
            runner.message_hub.update_info('last_ckpt', previous[1])
            raise
        if is_main_process():
            write_last_checkpoint(runner.work_dir, path)
        return path

    def _restore(self, runner, ids, hub_ids, last, hub_last) -> None:
        if ids is not None:  # only with max_keep_ckpts > 0
            self.keep_ckpt_ids = ids
        if hub_ids is not None:
            runner.message_hub.update_info('keep_ckpt_ids', hub_ids)
        self.last_ckpt = last
        if hub_last is not None:
            runner.message_hub.update_info('last_ckpt', hub_last)

    def _remove_checkpoint(self, runner, step: int) -> None:
        path = self.file_backend.join_path(
            self.out_dir, self.filename_tmpl.format(step)
        )
        try:
            self.file_backend.remove(path)  # a CheckpointRemovalBackend
        except OSError as err:  # a remote backend's failure
            runner.logger.warning(
                f'nanguard: cannot remove the outdated checkpoint {path!r} '
                f'({err}); it is kept'
            )


def write_last_checkpoint(work_dir: str, checkpoint: str) -> None:
    """Write ``<work_dir>/last_checkpoint`` naming ``checkpoint``, durably.

    Args:
        work_dir (str): The run's work dir.
        checkpoint (str): The checkpoint path, as mmengine writes it.
    """
    write_durable(osp.join(work_dir, 'last_checkpoint'), str(checkpoint))


def find_checkpoint_hook(runner) -> Optional[CheckpointHook]:
    """The runner's ``CheckpointHook`` (the first one), if any."""
    for hook in runner.hooks:
        if isinstance(hook, CheckpointHook):
            return hook
    return None


__all__ = [
    'DurableCheckpointHook',
    'find_checkpoint_hook',
    'write_last_checkpoint',
]
