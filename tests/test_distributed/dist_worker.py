# Copyright (c) mmnanguard contributors. All rights reserved.
"""One rank of a distributed test run (started by torchrun): build the
config's runner the way ``tools/train.py --launcher pytorch`` does, train,
then save this rank's model weights (full tensors, unwrapped) to
``WORK_DIR/weights_rank{RANK}.pth`` for the test to compare across ranks;
the full weights at the start go to ``WORK_DIR/start_rank{RANK}.pth``, at
the end of each epoch (0-based) to ``WORK_DIR/epoch{E}_rank{RANK}.pth``.

Usage: ``dist_worker.py CONFIG WORK_DIR [fsdp2] [every_iter]``
(``fsdp2``: shard the model with torch's ``fully_shard``,
:mod:`mmnanguard.testing.fsdp2`; ``every_iter``: also the full weights at
the start of each iteration N to ``WORK_DIR/iter{N}_rank{RANK}.pth``).
The toy model and dataset are registered for configs that name them
(:func:`mmnanguard.testing.toy.register_toy`).
"""

import sys

import torch


def full_state(model) -> dict:
    """The unwrapped model's state with every DTensor gathered, or an
    FSDP1 model's full state dict on every rank (a collective: call it on
    every rank)."""
    from torch.distributed.fsdp import (
        FullStateDictConfig,
        FullyShardedDataParallel,
        StateDictType,
    )

    from mmnanguard.engine.guard.snapshot import unwrap_model

    if isinstance(model, FullyShardedDataParallel):
        with FullyShardedDataParallel.state_dict_type(
            model,
            StateDictType.FULL_STATE_DICT,
            FullStateDictConfig(offload_to_cpu=False, rank0_only=False),
        ):
            return {
                k: v.detach().cpu().clone()
                for k, v in model.state_dict().items()
            }
    return {
        k: (v.full_tensor() if hasattr(v, 'full_tensor') else v)
        .detach()
        .cpu()
        .clone()
        for k, v in unwrap_model(model).state_dict().items()
    }


def main(config: str, work_dir: str, *flags: str) -> int:
    import torch.distributed as torch_dist
    from mmengine.config import Config
    from mmengine.hooks import Hook
    from mmengine.registry import RUNNERS

    import mmnanguard  # noqa: F401
    from mmnanguard.compat.cpu_distributed import prepare_cpu_distributed
    from mmnanguard.engine.runner.process_group_close import (
        close_process_group,
    )
    from mmnanguard.engine.runner.train_options import select_protected_runner
    from mmnanguard.testing.toy import register_toy

    class SaveFullWeights(Hook):
        priority = 'LOWEST'

        def before_train(self, runner) -> None:
            state = full_state(runner.model)
            rank = torch_dist.get_rank()
            torch.save(state, f'{work_dir}/start_rank{rank}.pth')

        def before_train_iter(
            self, runner, batch_idx: int, data_batch=None
        ) -> None:
            if 'every_iter' in flags:
                state = full_state(runner.model)
                rank = torch_dist.get_rank()
                torch.save(
                    state, f'{work_dir}/iter{runner.iter}_rank{rank}.pth'
                )

        def after_train_epoch(self, runner) -> None:
            state = full_state(runner.model)
            rank = torch_dist.get_rank()
            torch.save(state, f'{work_dir}/epoch{runner.epoch}_rank{rank}.pth')

    register_toy()
    cfg = Config.fromfile(config)
    cfg.work_dir = work_dir
    cfg.launcher = 'pytorch'
    select_protected_runner(cfg)
    prepare_cpu_distributed(cfg, 'pytorch')
    if 'fsdp2' in flags:
        from mmnanguard.testing.fsdp2 import register, skip_reinit

        cfg.model_wrapper_cfg = dict(type=register())
    runner = RUNNERS.build(cfg)
    if 'fsdp2' in flags:
        skip_reinit(runner)
    runner.register_hook(SaveFullWeights())
    completed = False
    try:
        runner.train()
        state = full_state(runner.model)
        rank = torch_dist.get_rank()
        torch.save(state, f'{work_dir}/weights_rank{rank}.pth')
        completed = True
    finally:
        close_process_group(completed)
    return 0


if __name__ == '__main__':
    from mmnanguard.engine.runner.process_group_close import exit_process

    exit_process(main(*sys.argv[1:]))
