# Copyright (c) mmnanguard contributors. All rights reserved.
"""Protected toy runs with a checkpoint every iteration, for the tests of
what planted links, races and crafted files make a run do."""

from typing import Any, Type

from mmnanguard.engine.runner import NanGuardRunner
from mmnanguard.testing.toy import toy_runner_cfg

#: Protection without the parts a toy model has nothing for.
PROTECTION = dict(
    policy='skip', hooks=[], check_labels=False, validate_annotations=None
)


def protected_toy_runner(
    work_dir: Any,
    max_iters: int,
    runner_type: Type = NanGuardRunner,
    **kwargs: Any,
) -> Any:
    """A ``runner_type`` (``NanGuardRunner`` or ``NanGuardFlexibleRunner``)
    of the toy model that saves a checkpoint every iteration.

    Args:
        work_dir (str | Path): The run's work dir.
        max_iters (int): Iterations to train.
        runner_type (type): The protected runner class.
        **kwargs: More arguments of the runner (``resume``, ``load_from``,
            ``cfg``, ``strategy``).
    """
    cfg = toy_runner_cfg(
        str(work_dir), max_iters=max_iters, nanguard=PROTECTION, **kwargs
    )
    cfg['default_hooks']['checkpoint'] = dict(
        type='CheckpointHook', interval=1, by_epoch=False
    )
    return runner_type(**cfg)
