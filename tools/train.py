# Copyright (c) mmnanguard contributors. All rights reserved.
"""Train any mmdet / mmrotate / mmseg config with mmnanguard's protection.

The flags of mmdet's ``tools/train.py`` (``--work-dir``, ``--amp``,
``--auto-scale-lr``, ``--resume [CKPT]``, ``--cfg-options``, ``--launcher``),
plus:

* ``--guard raise|skip|rollback|off``: protection for any config, without
  editing it (``configs/_base_/nanguard.py``'s settings with this policy);
* ``--smoke-test N``: N iterations with a fixed seed, no validation and no
  checkpoints; prints each iteration's loss terms and grad norm and exits
  1 if any is non-finite. The check to run before a long job.

Exit status: 0 done; 1 smoke test found a non-finite value; 2 wrong flag,
config or setting, or a runner, dataset or optimizer that cannot be built
from the config, or a --resume checkpoint that does not load while no other checkpoint next to
it does (nothing trained; one paragraph on stderr); 3 training stopped by the guard or by an
annotation check (one paragraph on stderr, the report path in it), or crashed on a config
mistake that the built model shows (a box loss fed encoded deltas; the fix in the paragraph); 4 preempted: SIGTERM or SIGINT
during a protected run, a checkpoint of the last finished iteration was saved and ``last_checkpoint``
names it (one paragraph on stderr; continue with ``--resume``; see
``mmnanguard/engine/runner/preemption.py``); 5 a checkpoint could not be
written (a full disk): the earlier ones are complete (one paragraph on
stderr; continue with ``--resume``).

``--launcher pytorch`` works on a CPU-only torch too (gloo), e.g.
``torchrun --nproc_per_node 2 tools/train.py CONFIG --launcher pytorch``.

Example:
    python tools/train.py configs/tiny/rotated-retinanet-rbox-le90_r18_tiny-dota.py --guard skip
"""  # noqa: E501

import argparse
import os
import os.path as osp
import sys
from typing import List, Optional

EXIT_SMOKE_FAILED, EXIT_USAGE, EXIT_STOPPED, EXIT_PREEMPTED = 1, 2, 3, 4
EXIT_WRITE_FAILED = 5
GUARD_CHOICES = ('raise', 'skip', 'rollback', 'off')
TRACEBACK_ENV = 'MMNANGUARD_TRACEBACK'


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f'{text!r} is invalid; expected an integer >= 1'
        )
    return value


def checked_dict_action():
    """mmengine's ``DictAction``, refusing a value it cannot parse with a
    usage error (exit 2) instead of its ``AssertionError`` or unbounded
    recursion (``"a=[dict(x=1,y=2)]"``)."""
    from mmengine.config import DictAction

    class CheckedDictAction(DictAction):
        def __call__(self, parser, namespace, values, option_string=None):
            for value in values:
                try:
                    super().__call__(parser, namespace, [value])
                except (AssertionError, RecursionError, ValueError):
                    parser.error(
                        f'argument {option_string}: cannot parse {value!r}; '
                        'expected KEY=VALUE with VALUE a number, a string, '
                        'or a list or tuple of them, such as a.b=1 '
                        "c='[1,2]' d='(3,4)'"
                    )

    return CheckedDictAction


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Parse the command line (``--guard`` values checked here)."""
    parser = argparse.ArgumentParser(
        description='Train a detector or segmentor with mmnanguard'
    )
    parser.add_argument('config', help='train config file path')
    parser.add_argument('--work-dir', help='the dir to save logs and models')
    parser.add_argument(
        '--amp',
        action='store_true',
        help='automatic mixed precision (CPUAmpOptimWrapper without a GPU)',
    )
    parser.add_argument(
        '--auto-scale-lr',
        action='store_true',
        help='enable automatically scaling LR',
    )
    parser.add_argument(
        '--resume',
        nargs='?',
        type=str,
        const='auto',
        help='resume from CKPT, or without CKPT from the latest checkpoint '
        'in the work dir',
    )
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=checked_dict_action(),
        help='override settings of the config, key=value pairs',
    )
    parser.add_argument(
        '--launcher',
        choices=['none', 'pytorch', 'slurm', 'mpi'],
        default='none',
        help='job launcher',
    )
    parser.add_argument(
        '--guard',
        choices=GUARD_CHOICES,
        help='protection policy for any config; default: as configured',
    )
    parser.add_argument(
        '--smoke-test',
        type=positive_int,
        metavar='N',
        help='run N iterations, print loss terms and grad norm, exit 1 on '
        'any non-finite value',
    )
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    if not osp.isfile(args.config):
        parser.error(f'config file {args.config!r} does not exist')
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args


def fail(message: str, code: int) -> int:
    """Print ``message`` as one paragraph on stderr; return ``code``."""
    print(f'tools/train.py: {message}', file=sys.stderr, flush=True)
    return code


def one_line(err: BaseException) -> str:
    """``err``'s message on one line, ending with a full stop."""
    text = ' '.join(str(err).split()) or repr(err)
    return text if text.endswith('.') else f'{text}.'


def refuse(what: str, err: Exception) -> int:
    """Report an error met before training as one paragraph (exit 2);
    with ``MMNANGUARD_TRACEBACK=1`` in the environment, re-raise it.

    Args:
        what (str): What failed, naming the config file.
        err (Exception): The error.

    Returns:
        int: ``EXIT_USAGE``.

    Raises:
        Exception: ``err``, when ``MMNANGUARD_TRACEBACK`` is set.
    """
    if os.environ.get(TRACEBACK_ENV):
        raise err
    return fail(
        f'{what}: {type(err).__name__}: {one_line(err)} Nothing was '
        f'trained (set {TRACEBACK_ENV}=1 for the traceback).',
        EXIT_USAGE,
    )


def build_config(args: argparse.Namespace):
    """Load the config and map the flags onto it (nothing is built)."""
    from mmnanguard.config_loading import load_training_config
    from mmnanguard.engine.runner import train_options as opts

    cfg = load_training_config(args.config)
    cfg.launcher = args.launcher
    if args.cfg_options is not None:
        cfg.merge_from_dict(args.cfg_options)
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join(
            './work_dirs', osp.splitext(osp.basename(args.config))[0]
        )
    notes = [opts.apply_guard_option(cfg, args.guard)]
    if args.amp:
        notes.append(opts.apply_amp_option(cfg))
    if args.auto_scale_lr:
        if 'base_batch_size' not in (cfg.get('auto_scale_lr') or {}):
            raise ValueError(
                '--auto-scale-lr needs auto_scale_lr.'
                'base_batch_size in the config'
            )
        cfg.auto_scale_lr.enable = True
    if args.resume == 'auto':
        cfg.resume, cfg.load_from = True, None
    elif args.resume is not None:
        cfg.resume, cfg.load_from = True, args.resume
    if args.smoke_test:
        opts.apply_smoke_test(cfg, args.smoke_test)
        notes.append(f'--smoke-test {args.smoke_test}')
    opts.check_protection(cfg)
    return cfg, notes


def main(argv: Optional[List[str]] = None) -> int:
    """Train; return the exit status (see the module docstring).

    A process group this run started is destroyed before returning, after
    every rank arrived when this rank's run ended with exit 0 or 4 (a gloo
    group destroyed while a peer still writes, or left to the
    interpreter's exit, can abort the process).
    """
    from mmnanguard.engine.runner.process_group_close import (
        close_process_group,
    )

    status = 1
    try:
        status = _train(parse_args(argv))
        return status
    finally:
        close_process_group(completed=status in (0, EXIT_PREEMPTED))


def _train(args: argparse.Namespace) -> int:
    from mmengine.logging import print_log
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner

    import mmnanguard  # noqa: F401  (stack mends before mmrotate.models)
    from mmnanguard.compat.cpu_distributed import prepare_cpu_distributed
    from mmnanguard.datasets import InvalidAnnotationError
    from mmnanguard.engine import NonFiniteTrainingError
    from mmnanguard.engine.guard.checkpoint_layout import (
        ShardedCheckpointError,
    )
    from mmnanguard.engine.runner import (
        DurableWriteError,
        TrainingPreempted,
        UnusableCheckpointError,
    )
    from mmnanguard.engine.runner import train_options as opts
    from mmnanguard.models.losses import InvalidLabelError

    try:
        cfg, notes = build_config(args)
    except Exception as err:  # any config error: one paragraph, exit 2
        return refuse(f'invalid configuration {args.config!r}', err)
    prepare_cpu_distributed(cfg, args.launcher)
    if args.smoke_test:  # the config doctor's findings come first
        from mmnanguard.analysis.doctor import doctor_summary

        print(doctor_summary(cfg), flush=True)
    try:
        if 'runner_type' in cfg:
            runner = RUNNERS.build(cfg)
        else:
            runner = Runner.from_cfg(cfg)
        opts.build_for_training(runner)
    except Exception as err:  # any build error: one paragraph, exit 2
        return refuse(f'cannot build the runner from {args.config!r}', err)
    print_log(f'tools/train.py: {"; ".join(notes)}', logger='current')
    try:
        runner.train()
    except (
        NonFiniteTrainingError,
        InvalidAnnotationError,
        InvalidLabelError,
    ) as err:
        return fail(
            f'{type(err).__name__}: {err} Training stopped; the log and the '
            f'incident reports are under {cfg.work_dir}.',
            EXIT_STOPPED,
        )
    except TrainingPreempted as err:
        return fail(f'{type(err).__name__}: {err}', EXIT_PREEMPTED)
    except DurableWriteError as err:
        return fail(
            f'{type(err).__name__}: {one_line(err)} The checkpoints written '
            f'before it are complete; free space under {cfg.work_dir} and '
            'continue with --resume.',
            EXIT_WRITE_FAILED,
        )
    except (UnusableCheckpointError, ShardedCheckpointError) as err:
        return fail(
            f'{type(err).__name__}: {one_line(err)} Nothing was trained.',
            EXIT_USAGE,
        )
    except Exception as err:  # a crash whose cause the built model shows
        fix = opts.crash_fix(runner)
        if fix is None or os.environ.get(TRACEBACK_ENV) == '1':
            raise
        return fail(
            f'{type(err).__name__}: {one_line(err)} Training crashed at '
            f'iteration {runner.iter}, and the config causes it: {fix}',
            EXIT_STOPPED,
        )
    if args.smoke_test:
        lines, ok = opts.smoke_test_rows(runner)
        print('\n'.join(['smoke test:'] + lines), flush=True)
        if not ok:
            return fail(
                f'smoke test failed: a non-finite loss term or grad norm '
                f'in {args.smoke_test} iterations (see above and '
                f'{osp.join(cfg.work_dir, "nanguard")}).',
                EXIT_SMOKE_FAILED,
            )
        print(
            f'smoke test passed: {args.smoke_test} iterations, every loss '
            'term and grad norm finite',
            flush=True,
        )
    return 0


if __name__ == '__main__':
    from mmnanguard.engine.runner.process_group_close import exit_process

    exit_process(main())
