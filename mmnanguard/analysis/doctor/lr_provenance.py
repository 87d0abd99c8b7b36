# Copyright (c) mmnanguard contributors. All rights reserved.
"""Which file of a config's ``_base_`` chain set a value, and the learning
rate that ``auto_scale_lr.base_batch_size`` was written for.

``base_batch_size`` describes the lr of the file that sets it: a config
that inherits it and changes only the lr (scaled by hand for a smaller
batch) keeps a ``base_batch_size`` written for another lr.
"""

import os.path as osp
from typing import Any, Callable, List, NamedTuple, Optional

from mmengine.config import Config


class LrReference(NamedTuple):
    """The lr that ``base_batch_size`` was written for.

    Args:
        lr (float): That lr.
        base_batch_size (int): The batch it was set for.
        source (str): The config file that sets ``base_batch_size`` ('' if
            the config has no file).
    """

    lr: float
    base_batch_size: int
    source: str


def _lr(cfg: Any) -> Any:
    return ((cfg.get('optim_wrapper') or {}).get('optimizer') or {}).get('lr')


def _base_batch(cfg: Any) -> Any:
    return (cfg.get('auto_scale_lr') or {}).get('base_batch_size')


def _bases(filename: str) -> List[str]:
    """The ``_base_`` files of ``filename`` (relative or ``pkg::``)."""
    return [
        Config._get_cfg_path(base, filename)[0]
        for base in Config._get_base_files(filename)
    ]


def setting_file(filename: str, get: Callable[[Any], Any]) -> Optional[str]:
    """The most derived file of the chain of ``filename`` whose value of
    ``get`` is not inherited from one of its bases.

    Args:
        filename (str): A config file.
        get (Callable): Reads the value off a loaded config.

    Returns:
        str | None: The file, or None if no file sets the value.
    """
    value = get(Config.fromfile(filename))
    if value is None:
        return None
    for base in _bases(filename):
        if get(Config.fromfile(base)) == value:
            return setting_file(base, get)
    return filename


def lr_reference(cfg: Config) -> Optional[LrReference]:
    """The lr that ``auto_scale_lr.base_batch_size`` describes.

    That is the lr of the config loaded from the file that sets
    ``base_batch_size``; the config's own lr where it has no file or the
    chain cannot be read.

    Args:
        cfg (Config): The loaded config (``--cfg-options`` merged).

    Returns:
        LrReference | None: None without ``base_batch_size`` or lr.
    """
    base, lr = _base_batch(cfg), _lr(cfg)
    if not isinstance(base, int) or not isinstance(lr, (int, float)):
        return None
    filename = getattr(cfg, 'filename', None)
    if not filename or not osp.isfile(filename):
        return LrReference(lr, base, '')
    try:
        source = setting_file(filename, _base_batch)
        written = Config.fromfile(source) if source else cfg
    except (OSError, SyntaxError, KeyError, TypeError, ValueError):
        return LrReference(lr, base, '')
    if _base_batch(written) != base or not isinstance(
        _lr(written), (int, float)
    ):
        # base_batch_size changed after the files (--cfg-options)
        return LrReference(lr, base, '')
    return LrReference(
        _lr(written), base, osp.normpath(source) if source else ''
    )
