# Copyright (c) mmnanguard contributors. All rights reserved.
"""Console entry points for the scripts shipped in ``mmnanguard/.mim/tools``.

An installed mmnanguard (wheel or editable) has its ``tools/*.py`` under
``mmnanguard/.mim/tools``, like the OpenMMLab packages. Each entry point
runs one of them as ``python tools/NAME.py ARGS`` would, with mmnanguard
imported first (its usage line names the script, e.g. ``train.py``):

==========================  ===========================
command                     script
==========================  ===========================
``mmnanguard-train``        ``tools/train.py``
``mmnanguard-check-dataset``  ``tools/check_dataset.py``
``mmnanguard-replay``       ``tools/replay.py``
``mmnanguard-check-loss``   ``tools/check_loss.py``
``mmnanguard-doctor``       ``tools/doctor.py``
==========================  ===========================
"""

import os.path as osp
import sys
from typing import Callable, Dict, List, Optional

#: console command -> script name in ``.mim/tools``.
COMMANDS: Dict[str, str] = {
    'mmnanguard-train': 'train',
    'mmnanguard-check-dataset': 'check_dataset',
    'mmnanguard-replay': 'replay',
    'mmnanguard-check-loss': 'check_loss',
    'mmnanguard-doctor': 'doctor',
}


def tool_path(name: str) -> str:
    """The shipped script ``tools/NAME.py`` of the installed package.

    Args:
        name (str): A script name, e.g. ``'train'``.

    Returns:
        str: Its path under ``mmnanguard/.mim/tools``.
    """
    package = osp.dirname(osp.abspath(__file__))
    return osp.join(package, '.mim', 'tools', f'{name}.py')


def run_tool(command: str, argv: Optional[List[str]] = None) -> int:
    """Run the script of ``command`` with ``argv``.

    Args:
        command (str): A key of :data:`COMMANDS`.
        argv (list[str], optional): The arguments. Defaults to
            ``sys.argv[1:]``.

    Returns:
        int: 0 when the script returns normally (one that calls
        ``sys.exit`` exits with its own status); 2 when the command is
        unknown or its script is missing from the installation.
    """
    if command not in COMMANDS:
        print(
            f'nanguard: unknown command {command!r}; expected one of '
            f'{sorted(COMMANDS)}',
            file=sys.stderr,
        )
        return 2
    script = tool_path(COMMANDS[command])
    if not osp.isfile(script):
        print(
            f'{command}: the script {script} is not installed (the '
            'package data of mmnanguard is incomplete); reinstall '
            'mmnanguard from a wheel or with pip install -e .',
            file=sys.stderr,
        )
        return 2
    from mmnanguard.__main__ import run_script

    run_script(script, sys.argv[1:] if argv is None else argv)
    return 0


def _entry_point(command: str) -> Callable[[], int]:
    """The ``console_scripts`` function of ``command``."""

    def entry() -> int:
        return run_tool(command)

    entry.__name__ = entry.__qualname__ = COMMANDS[command]
    entry.__doc__ = f'``{command} ARGS``: ``tools/{COMMANDS[command]}.py``.'
    return entry


train = _entry_point('mmnanguard-train')
check_dataset = _entry_point('mmnanguard-check-dataset')
replay = _entry_point('mmnanguard-replay')
check_loss = _entry_point('mmnanguard-check-loss')
doctor = _entry_point('mmnanguard-doctor')

#: ``console_scripts`` lines (``[project.scripts]`` of ``pyproject.toml``).
CONSOLE_SCRIPTS = [
    f'{command} = mmnanguard.cli:{name}' for command, name in COMMANDS.items()
]

__all__ = ['COMMANDS', 'CONSOLE_SCRIPTS', 'run_tool', 'tool_path']
