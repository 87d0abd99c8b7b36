# Copyright (c) mmnanguard contributors. All rights reserved.
"""Runs of the tiny rotated RetinaNet (the upstream mmrotate config, shrunk,
``RandomFlip`` on, shuffled ``DefaultSampler``) that record the batch each
iteration trained: its files and flips, for an exact-resume comparison."""

import os.path as osp
import signal
import uuid
from typing import Any, List, Optional, Tuple

from integration_utils import NANGUARD_DOTA
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.registry import RUNNERS

from mmnanguard.engine.runner.preemption import TrainingPreempted
from mmnanguard.testing import TINY_DOTA_CONFIG

#: One trained batch: (runner.iter, batch_idx, files, flips).
Batch = Tuple[int, int, Tuple[str, ...], Tuple[bool, ...]]


class Stopped(Exception):
    """Raised after the checkpoint of the stopping iteration was written
    (the files on disk are those of a kill -9 right after it)."""


class BatchRecorder(Hook):
    """Record each trained batch; raise :class:`Stopped` after iteration
    ``stop_at`` (after every other hook, the checkpoint's included), or
    send this process SIGTERM during it (the protected runner saves at the
    end of the iteration and raises ``TrainingPreempted``)."""

    priority = 'LOWEST'

    def __init__(
        self, seen: List[Batch], stop_at: Optional[int], how: str = 'raise'
    ) -> None:
        self.seen, self.stop_at, self.how = seen, stop_at, how

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        if self.how == 'sigterm' and runner.iter + 1 == self.stop_at:
            signal.raise_signal(signal.SIGTERM)

    def after_train_iter(
        self, runner, batch_idx, data_batch=None, outputs=None
    ) -> None:
        samples = data_batch['data_samples']
        self.seen.append(
            (
                runner.iter,
                batch_idx,
                tuple(osp.basename(s.img_path) for s in samples),
                tuple(bool(s.flip) for s in samples),
            )
        )
        if self.how == 'raise' and runner.iter + 1 == self.stop_at:
            raise Stopped


def resume_config(
    work_dir: str,
    data_root: str,
    loop: str,
    num_workers: int,
    protected: bool = True,
) -> Config:
    """The config: 2 epochs of 4 iterations (or 8 iterations of an
    ``IterBasedTrainLoop`` over the same finite sampler), a checkpoint
    after every iteration (the newest two kept: a resume reads the
    newest)."""
    cfg = Config.fromfile(NANGUARD_DOTA if protected else TINY_DOTA_CONFIG)
    cfg.work_dir = work_dir
    # unique in the process: runners of one name share mmengine's
    # visualizer and logger instances (and so their folders)
    cfg.experiment_name = f'{osp.basename(work_dir)}_{uuid.uuid4().hex[:8]}'
    cfg.train_dataloader.dataset.data_root = osp.join(data_root, '')
    cfg.train_dataloader.num_workers = num_workers
    cfg.train_dataloader.persistent_workers = num_workers > 0
    if loop == 'epoch':
        cfg.train_cfg = dict(by_epoch=True, max_epochs=2, val_interval=100)
    else:
        cfg.train_cfg = dict(
            type='IterBasedTrainLoop', max_iters=8, val_interval=10**9
        )
        cfg.log_processor.by_epoch = False
        for scheduler in cfg.param_scheduler:
            scheduler.by_epoch = False
            scheduler.pop('convert_to_iter_based', None)
    cfg.default_hooks.checkpoint = dict(
        type='CheckpointHook', interval=1, by_epoch=False, max_keep_ckpts=2
    )
    return cfg


def train(
    cfg: Config,
    stop_at: Optional[int] = None,
    resume: bool = False,
    how: str = 'raise',
) -> Tuple[Any, List[Batch]]:
    """Build the runner of ``cfg`` and train; return it and its batches."""
    seen: List[Batch] = []
    cfg.resume = resume
    if resume:
        cfg.experiment_name += '_resumed'
    runner = RUNNERS.build(cfg)
    # before PreemptionHook (LOWEST), which raises at the preemption save
    priority = 'VERY_LOW' if how == 'sigterm' else 'LOWEST'
    runner.register_hook(BatchRecorder(seen, stop_at, how), priority)
    try:
        runner.train()
    except (Stopped, TrainingPreempted):
        pass
    return runner, seen


def differing_tensors(first: dict, second: dict) -> List[str]:
    """The keys whose tensors are not ``torch.equal``."""
    import torch

    assert first.keys() == second.keys()
    return [k for k in first if not torch.equal(first[k], second[k])]
