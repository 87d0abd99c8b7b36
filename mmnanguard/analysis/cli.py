# Copyright (c) mmnanguard contributors. All rights reserved.
"""What ``tools/check_loss.py`` and ``tools/doctor.py`` share: loading the
config named on the command line, and the one-paragraph usage error."""

import argparse
import os.path as osp
import sys
from typing import Optional, Tuple

from mmengine.config import Config

from .config_path import resolve_config_path

#: What loading a config or building a type can raise for bad input.
INPUT_ERRORS = (
    ValueError,
    TypeError,
    KeyError,
    FileNotFoundError,
    SyntaxError,
    ImportError,
    AttributeError,
)
EXIT_USAGE = 2


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1.

    Raises:
        argparse.ArgumentTypeError: ``text`` is not one.
    """
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(
            f'{text!r} is invalid; expected an integer >= 1'
        )
    return int(text)


def usage_error(prog: str, message: str) -> int:
    """Print ``message`` as one paragraph on stderr.

    Args:
        prog (str): The tool, e.g. ``'tools/doctor.py'``.
        message (str): What is wrong, with the value.

    Returns:
        int: Exit code 2.
    """
    print(f'{prog}: {message}', file=sys.stderr, flush=True)
    return EXIT_USAGE


def load_config(
    path: str, cfg_options: Optional[dict] = None
) -> Tuple[Optional[Config], Optional[str]]:
    """Load the config ``path`` (a file or ``PACKAGE::path``).

    Args:
        path (str): As given on the command line.
        cfg_options (dict, optional): ``--cfg-options`` to merge.

    Returns:
        tuple: The config and None, or None and the error message.
    """
    try:
        filename = resolve_config_path(path)
    except ValueError as err:
        return None, str(err)
    if not osp.isfile(filename):
        return None, f'config file {path!r} does not exist'
    try:
        cfg = Config.fromfile(filename)
        if cfg_options:
            cfg.merge_from_dict(cfg_options)
    except INPUT_ERRORS as err:
        return None, (
            f'invalid configuration {path!r}: {type(err).__name__}: {err}'
        )
    return cfg, None
