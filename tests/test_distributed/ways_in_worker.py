# Copyright (c) mmnanguard contributors. All rights reserved.
"""One rank of a ways-in run (started by torchrun): build a toy run the way
one documented way in builds it, train, and save this rank's final weights
to ``WORK_DIR/weights_rank{RANK}.pth``.

Usage: ``ways_in_worker.py WAY MODE WORK_DIR MAX_ITERS [resume] [slow]
[jitter] [workers] [epoch]`` (``jitter``: the jittered samples and the
model with dropout; ``workers``: 2 loader workers per rank and
``diff_rank_seed=True``; ``epoch``: an epoch-based loop, epochs of 4
iterations)

* ``WAY``: ``include`` (``runner_type='mmnanguard.NanGuardRunner'`` and
  the include's settings, built by ``RUNNERS.build`` as the upstream
  scripts do), ``twin`` (the settings-only include, no runner line of its
  own: ``Runner.from_cfg`` as the upstream scripts call it), ``hook``
  (``NanGuardHook`` alone in ``custom_hooks`` of a plain runner),
  ``guard`` (``tools/train.py --guard skip``'s config edit).
* ``MODE``: ``runner`` (mmengine's ``Runner``; DDP when torchrun starts
  more than one process), or a ``FlexibleRunner`` with the strategy of
  :data:`STRATEGIES`: ``flexible`` (``DDPStrategy``), ``fsdp1``
  (``FSDPStrategy``, full state dicts), ``deepspeed``
  (``DeepSpeedStrategy``, ZeRO-2, ``DeepSpeedOptimWrapper``).

A NaN gradient (``FaultInjectionHook``'s ``nan_grad``: under FSDP1 a
flat parameter's shard, under ZeRO a module parameter whose gradient its
hooks reduce into the flat partition) is planted at iteration 3 on the
last rank; checkpoints are written every 2 iterations (``CheckpointHook``
on rank 0 only, as mmengine does).

``slow`` (the preemption tests): each iteration ends with a 0.5 s sleep
after writing ``WORK_DIR/reached_rank{RANK}_iter{N}`` (its content: the
process id), so that a signal sent on seeing it lands mid-run; the
periodic checkpoints are off (the preemption save is the only one). A
``TrainingPreempted`` ends the rank with ``EXIT_PREEMPTED`` (4) as
``tools/train.py`` does, after writing ``WORK_DIR/preempted_rank{RANK}.json``
(the iteration and the checkpoint it names) and a barrier.
"""

import json
import os
import sys
import time

import torch
from dist_worker import full_state
from mmengine.hooks import Hook


class SlowIterationHook(Hook):
    """Mark the end of each iteration with a file, then sleep.

    Args:
        seconds (float): The sleep after each iteration.
    """

    priority = 'VERY_HIGH'  # before PreemptionHook ('LOWEST') acts

    def __init__(self, seconds: float = 0.5) -> None:
        self.seconds = seconds

    def after_train_iter(
        self, runner, batch_idx, data_batch=None, outputs=None
    ) -> None:
        """Write ``reached_rank{RANK}_iter{N}`` and sleep."""
        from mmengine.dist import get_rank

        name = f'reached_rank{get_rank()}_iter{runner.iter + 1}'
        with open(os.path.join(runner.work_dir, name), 'w') as f:
            f.write(str(os.getpid()))
        time.sleep(self.seconds)


#: The strategy of each ``FlexibleRunner`` mode.
STRATEGIES = dict(
    flexible=dict(type='DDPStrategy'),
    fsdp1=dict(type='FSDPStrategy', state_dict_cfg='full'),
    deepspeed=dict(
        type='DeepSpeedStrategy',
        zero_optimization=dict(stage=2),
        config=dict(zero_allow_untested_optimizer=True),
    ),
)


def build_cfg(
    way: str,
    mode: str,
    work_dir: str,
    max_iters: int,
    resume,
    slow: bool = False,
    jitter: bool = False,
    workers: int = 0,
    by_epoch: bool = False,
):
    import ways_in_toy  # noqa: F401  (WaysInToyModel, WaysInToyDataset)
    from mmengine.config import Config
    from mmengine.registry import HOOKS

    from mmnanguard.engine.runner.train_options import (
        RUNNER_TYPE,
        apply_guard_option,
        default_protection,
    )
    from mmnanguard.testing.toy import toy_runner_cfg

    # registered, so that the config holds only plain values (mmengine
    # prints it)
    HOOKS.register_module(
        'WaysInSlowIterationHook', module=SlowIterationHook, force=True
    )

    world = int(os.environ.get('WORLD_SIZE', '1'))
    fault = dict(
        type='FaultInjectionHook',
        fault='nan_grad',
        iteration=3,
        # FSDP2 shards the toy's [1, 4] weights by rows: the last rank
        # holds no element of any parameter
        rank=0 if mode == 'fsdp2' else world - 1,
    )
    hooks = [fault]
    if way == 'hook':
        hooks.append(dict(type='NanGuardHook', policy='skip'))
    if slow:
        hooks.append(dict(type='WaysInSlowIterationHook'))
    cfg = toy_runner_cfg(
        work_dir,
        max_iters=max_iters,
        custom_hooks=hooks,
        model=dict(
            type='WaysInDropoutToyModel' if jitter else 'WaysInToyModel'
        ),
        env_cfg=dict(dist_cfg=dict(backend='gloo')),
        launcher='pytorch' if world > 1 else 'none',
        resume=resume,
    )
    cfg['train_dataloader']['dataset'] = dict(
        type='WaysInJitteredToyDataset' if jitter else 'WaysInToyDataset'
    )
    if by_epoch:  # epochs of 4 iterations (16 samples, 2 ranks, batch 2)
        cfg['train_dataloader']['dataset']['n'] = 16
        cfg['train_cfg'] = dict(by_epoch=True, max_epochs=max_iters // 4)
    if workers:  # the model's dropout draws from the main process alone,
        # whose generators differ by rank (else every rank's equal rank 0's)
        cfg['train_dataloader'].update(
            num_workers=workers, persistent_workers=True
        )
        cfg['randomness'] = dict(seed=0, diff_rank_seed=True)
    if slow:  # the preemption save is the only checkpoint
        cfg['default_hooks']['checkpoint']['interval'] = 10 * max_iters
    if mode == 'fsdp2':
        from mmnanguard.testing.fsdp2 import register

        cfg['model_wrapper_cfg'] = dict(type=register())
    if mode in STRATEGIES:
        cfg['runner_type'] = 'FlexibleRunner'
        cfg['strategy'] = STRATEGIES[mode]
    if mode == 'deepspeed':
        cfg['optim_wrapper']['type'] = 'DeepSpeedOptimWrapper'
    if way == 'include':
        cfg['runner_type'] = RUNNER_TYPE
        cfg['nanguard'] = default_protection()
        if mode in STRATEGIES:
            cfg['runner_type'] = 'mmnanguard.NanGuardFlexibleRunner'
    elif way == 'twin':
        cfg['nanguard'] = default_protection()
    cfg = Config(cfg)
    if way == 'guard':
        apply_guard_option(cfg, 'skip')
    return cfg


def main(way: str, mode: str, work_dir: str, max_iters: str, *rest) -> int:
    import torch.distributed as torch_dist
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner

    import mmnanguard  # noqa: F401
    from mmnanguard.compat.cpu_distributed import prepare_cpu_distributed
    from mmnanguard.engine.runner.preemption import (
        EXIT_PREEMPTED,
        TrainingPreempted,
    )
    from mmnanguard.engine.runner.process_group_close import (
        close_process_group,
    )

    cfg = build_cfg(
        way,
        mode,
        work_dir,
        int(max_iters),
        'resume' in rest,
        'slow' in rest,
        'jitter' in rest,
        2 if 'workers' in rest else 0,
        'epoch' in rest,
    )
    prepare_cpu_distributed(cfg, cfg.launcher)
    # as mmdet's tools/train.py builds it
    if 'runner_type' in cfg:
        runner = RUNNERS.build(cfg)
    else:
        runner = Runner.from_cfg(cfg)
    if mode == 'fsdp2':
        from mmnanguard.testing.fsdp2 import skip_reinit

        skip_reinit(runner)
    try:
        runner.train()
    except TrainingPreempted as err:  # as tools/train.py maps it
        rank = torch_dist.get_rank() if torch_dist.is_initialized() else 0
        with open(f'{work_dir}/preempted_rank{rank}.json', 'w') as f:
            json.dump(
                dict(
                    iteration=err.iteration,
                    checkpoint=err.checkpoint,
                    signal=err.signal_name,
                    runner_iter=runner.iter,
                ),
                f,
            )
        # every rank's record exists before torchrun, seeing the first rank
        # exit, stops the others
        close_process_group(completed=True)
        return EXIT_PREEMPTED
    rank = torch_dist.get_rank() if torch_dist.is_initialized() else 0
    state = full_state(runner.model)  # FSDP1's shards gathered
    torch.save(state, f'{work_dir}/weights_rank{rank}.pth')
    with open(f'{work_dir}/runner_rank{rank}.txt', 'w') as f:
        f.write(type(runner).__name__)
    close_process_group(completed=True)
    return 0


if __name__ == '__main__':
    from mmnanguard.engine.runner.process_group_close import exit_process

    exit_process(main(*sys.argv[1:]))
