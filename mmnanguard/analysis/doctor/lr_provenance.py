# Copyright (c) mmnanguard contributors. All rights reserved.
"""The learning rates that the files of a config's ``_base_`` chain write
for its ``auto_scale_lr.base_batch_size``.

A config that inherits ``base_batch_size`` and changes only the lr
(scaled by hand for a smaller batch) keeps a ``base_batch_size`` written
for the lr of one of its bases.
"""

import os.path as osp
from typing import Any, List, NamedTuple

from mmengine.config import Config


class WrittenLr(NamedTuple):
    """An lr that a file of a config's ``_base_`` chain writes for the
    config's ``auto_scale_lr.base_batch_size``.

    Args:
        lr (float): That lr.
        source (str): The file (its name only, no folder).
    """

    lr: float
    source: str


def _optimizer(cfg: Any) -> Any:
    return (cfg.get('optim_wrapper') or {}).get('optimizer') or {}


def _lr(cfg: Any) -> Any:
    return _optimizer(cfg).get('lr')


def _base_batch(cfg: Any) -> Any:
    return (cfg.get('auto_scale_lr') or {}).get('base_batch_size')


def _bases(filename: str) -> List[str]:
    """The ``_base_`` files of ``filename`` (relative or ``pkg::``)."""
    return [
        Config._get_cfg_path(base, filename)[0]
        for base in Config._get_base_files(filename)
    ]


def chain_files(filename: str) -> List[str]:
    """``filename`` and every file of its ``_base_`` chain, most derived
    first (depth first, in the order each file names its bases).

    Args:
        filename (str): A config file.

    Returns:
        list[str]: The files, each once.
    """
    files = [filename]
    for base in _bases(filename):
        files.extend(f for f in chain_files(base) if f not in files)
    return files


def written_lrs(cfg: Config) -> List[WrittenLr]:
    """The lrs that the files of the config's chain write for its
    ``base_batch_size``, most derived file first, each value once.

    A file that keeps the chain's ``base_batch_size`` and changes the lr
    (mmdet's RetinaNet writes 0.01 over ``schedule_1x.py``'s 0.02, both
    for 16 images; a user's config writes 0.00125, that 0.01 scaled by
    hand to 2 images) adds an lr; a file loaded with another
    ``base_batch_size`` or another optimizer type adds none.

    Args:
        cfg (Config): The loaded config (``--cfg-options`` merged: an lr
            set there is in no file).

    Returns:
        list[WrittenLr]: Empty without ``base_batch_size``, without a
        config file, or when the chain cannot be read.
    """
    base, kind = _base_batch(cfg), _optimizer(cfg).get('type')
    filename = getattr(cfg, 'filename', None)
    if not isinstance(base, int) or not filename or not osp.isfile(filename):
        return []
    found: List[WrittenLr] = []
    try:
        for path in chain_files(filename):
            loaded = Config.fromfile(path)
            lr = _lr(loaded)
            if (
                _base_batch(loaded) != base
                or _optimizer(loaded).get('type') != kind
                or not isinstance(lr, (int, float))
            ):
                continue
            if all(w.lr != lr for w in found):
                found.append(WrittenLr(lr, osp.basename(path)))
    except (OSError, SyntaxError, KeyError, TypeError, ValueError):
        return found
    return found
