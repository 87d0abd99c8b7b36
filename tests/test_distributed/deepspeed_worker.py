# Copyright (c) mmnanguard contributors. All rights reserved.
"""One rank of a DeepSpeed test run (started by torchrun): the toy model
and dataset are registered under the names the test's config uses
(``ToyModel``, ``ToyDataset``), and ``ZeroStateRecorder`` records this
rank's ZeRO partition state around the iterations it is given; then
:func:`dist_worker.main` builds the config's runner and trains.

Usage: ``deepspeed_worker.py CONFIG WORK_DIR``.
"""

import sys

import torch
from dist_worker import main
from mmengine.hooks import Hook
from mmengine.registry import DATASETS, HOOKS, MODELS

from mmnanguard.testing.toy import ToyDataset, ToyModel


def zero_state(runner) -> dict:
    """This rank's fp32 partition and momentum, copied."""
    optimizer = runner.optim_wrapper.optimizer
    return dict(
        fp32=[
            t.detach().clone()
            for t in optimizer.single_partition_of_fp32_groups
        ],
        momentum=[
            s['momentum_buffer'].detach().clone()
            for s in optimizer.optimizer.state.values()
            if s.get('momentum_buffer') is not None
        ],
    )


class ZeroStateRecorder(Hook):
    """Save this rank's ZeRO state before (``when='before'``, registered
    with priority ``HIGHEST``: before any fault is planted) or after
    (``'after'``, priority ``LOWEST``: after a checkpoint's agreed check)
    each of ``iterations`` to ``WORK_DIR/zero_iter{I}_rank{R}_{when}.pth``.

    Args:
        iterations (list[int]): The iterations to record.
        when (str): ``'before'`` or ``'after'``.
    """

    def __init__(self, iterations, when: str) -> None:
        self.iterations = list(iterations)
        self.when = when

    def _save(self, runner) -> None:
        rank = torch.distributed.get_rank()
        torch.save(
            zero_state(runner),
            f'{runner.work_dir}/zero_iter{runner.iter}_rank{rank}_'
            f'{self.when}.pth',
        )

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        if self.when == 'before' and runner.iter in self.iterations:
            self._save(runner)

    def after_train_iter(
        self, runner, batch_idx, data_batch=None, outputs=None
    ) -> None:
        if self.when == 'after' and runner.iter in self.iterations:
            self._save(runner)


if __name__ == '__main__':
    MODELS.register_module('ToyModel', module=ToyModel, force=True)
    DATASETS.register_module('ToyDataset', module=ToyDataset, force=True)
    HOOKS.register_module(module=ZeroStateRecorder, force=True)
    sys.exit(main(*sys.argv[1:]))
