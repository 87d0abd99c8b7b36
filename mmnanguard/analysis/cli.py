# Copyright (c) mmnanguard contributors. All rights reserved.
"""What ``tools/check_loss.py``, ``tools/check_dataset.py`` and
``tools/doctor.py`` share: loading the config named on the command line,
``KEY=VALUE`` options, and the one-paragraph usage error (exit status 2,
no traceback)."""

import argparse
import os.path as osp
import sys
from typing import Any, Optional, Sequence, Tuple

from mmengine.config import Config, DictAction

from mmnanguard.config_loading import load_training_config

from .config_path import resolve_config_path

#: What loading a config or building a type can raise for bad input.
INPUT_ERRORS = (
    ValueError,
    TypeError,
    KeyError,
    OSError,
    SyntaxError,
    ImportError,
    AttributeError,
    RecursionError,
)
EXIT_USAGE = 2
#: The file types mmengine reads a config from.
CONFIG_SUFFIXES = ('.py', '.json', '.yaml', '.yml')


def _balanced(text: str) -> bool:
    """Whether the brackets of ``text`` open and close in order."""
    closing = {')': '(', ']': '['}
    stack = []
    for char in text:
        if char in '([':
            stack.append(char)
        elif char in closing:
            if not stack or stack.pop() != closing[char]:
                return False
    return not stack


def _exit_usage(parser: argparse.ArgumentParser, message: str) -> None:
    """Exit with status 2 and ``message`` as one paragraph (no usage
    block, no traceback)."""
    parser.exit(EXIT_USAGE, f'{parser.prog}: error: {message}\n')


class KeyValueAction(DictAction):
    """mmengine's :class:`DictAction` (``KEY=VALUE`` items into a dict),
    with a usage error instead of a traceback for an item that is not
    ``KEY=VALUE`` or whose brackets do not balance.

    Example:
        >>> parser.add_argument('--cfg-options', nargs='+',
        ...                     action=KeyValueAction)
    """

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: Optional[str] = None,
    ) -> None:
        items: Sequence[str] = (
            [values] if isinstance(values, str) else values or []
        )
        for item in items:
            key, sep, value = item.partition('=')
            if not sep or not key:
                _exit_usage(
                    parser,
                    f'{option_string} {item!r} is invalid: expected '
                    'KEY=VALUE, e.g. gamma=2.0 or betas=[0.9,0.999]',
                )
            if not _balanced(value.strip('\'"')):
                _exit_usage(
                    parser,
                    f'{option_string} {item!r} is invalid: the brackets of '
                    f'the value {value!r} do not balance; expected a number, '
                    'a word, or a list like [1,2] or (1,2)',
                )
        super().__call__(parser, namespace, values, option_string)


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
    if not filename.endswith(CONFIG_SUFFIXES):
        return None, (
            f'{path!r} is not a config file: expected an mmengine config '
            f'({", ".join(CONFIG_SUFFIXES)}), e.g. configs/retinanet.py or '
            "'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py'"
        )
    try:
        cfg = load_training_config(filename)
        if cfg_options:
            cfg.merge_from_dict(cfg_options)
    except INPUT_ERRORS as err:
        return None, (
            f'invalid configuration {path!r}: {type(err).__name__}: {err}'
        )
    return cfg, None
