# Copyright (c) mmnanguard contributors. All rights reserved.
"""Dump the run's config into its work dir without following a link.

mmengine 0.10.7's ``Runner.dump_config`` (and ``FlexibleRunner``'s) writes
``cfg.dump(osp.join(work_dir, filename))``, which is
``open(path, 'w')``: a link planted at ``work_dir/<config>.py`` is
followed, and the config is written over whatever it points to.
:func:`dump_config_durably` writes the same text with
:func:`~mmnanguard.fileio.durable_file.write_durable` instead: a new
temporary file created with ``O_EXCL``, renamed over the name, so a link
there is replaced (and logged), never written through, and the dump is
complete or absent.
"""

import logging
import os
import os.path as osp
import stat
from typing import Any

from mmengine.logging import print_log

from mmnanguard.fileio.durable_file import write_durable


def config_dump_path(runner: Any) -> str:
    """Where mmengine dumps ``runner.cfg``: ``work_dir`` and the config's
    base name, or ``<timestamp>.py`` for a config without a file."""
    if runner.cfg.filename is not None:
        filename = osp.basename(runner.cfg.filename)
    else:
        filename = f'{runner.timestamp}.py'
    return osp.join(runner.work_dir, filename)


def dump_config_durably(runner: Any) -> str:
    """Write ``runner.cfg`` (the text mmengine's ``dump_config`` writes)
    to :func:`config_dump_path`, durably and never through a link.

    Args:
        runner: The runner, its ``work_dir`` created.

    Returns:
        str: The path written.

    Raises:
        DurableWriteError: The write failed (a full disk); nothing was
            written through a link.
    """
    path = config_dump_path(runner)
    try:
        planted = stat.S_ISLNK(os.lstat(path).st_mode)
    except FileNotFoundError:
        planted = False
    if planted:
        print_log(
            f'nanguard: {path} was a symbolic link to '
            f'{os.readlink(path)!r}; the config dump replaces the link, '
            'and its target is left unchanged',
            logger='current',
            level=logging.WARNING,
        )
    write_durable(path, runner.cfg.dump())
    return path


__all__ = ['config_dump_path', 'dump_config_durably']
