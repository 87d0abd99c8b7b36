# Copyright (c) mmnanguard contributors. All rights reserved.
"""``python -m mmnanguard SCRIPT [ARGS...]``: run a script with mmnanguard
imported first.

Upstream scripts such as mmrotate's official ``tools/train.py`` import
``mmrotate.models`` before they read the config, which fails on Python
>= 3.10 (``from collections import Sequence`` in mmrotate 1.0.0rc1); no
config key can run earlier than that import. Run through this module, the
script sees the stack mended, every mmnanguard module registered and
``mmnanguard::`` config paths resolvable, and runs otherwise unchanged
(``sys.argv`` and ``sys.path[0]`` as with ``python SCRIPT ARGS``).

Example:
    python -m mmnanguard $(python -c "import mmrotate, os; print(os.path.dirname(mmrotate.__file__))")/.mim/tools/train.py CONFIG
"""  # noqa: E501

import os.path as osp
import runpy
import sys
from typing import List, Optional

import mmnanguard  # noqa: F401  (mends and registrations)

USAGE = 'usage: python -m mmnanguard SCRIPT [ARGS...]'


def run_script(script: str, args: List[str]) -> None:
    """Run ``script`` as ``__main__`` as ``python SCRIPT ARGS`` would
    (``sys.argv`` is ``[SCRIPT] + ARGS``, ``sys.path[0]`` its folder).

    Args:
        script (str): Path of a Python file.
        args (list[str]): Its arguments (``sys.argv[1:]``).
    """
    sys.argv = [script] + list(args)
    sys.path[0] = osp.dirname(osp.abspath(script))
    runpy.run_path(script, run_name='__main__')


def main(argv: Optional[List[str]] = None) -> int:
    """Run ``argv[0]`` as ``__main__`` with ``argv`` as its ``sys.argv``.

    Args:
        argv (list[str], optional): ``SCRIPT [ARGS...]``. Defaults to
            ``sys.argv[1:]``.

    Returns:
        int: 0 when the script returns normally (a script that calls
        ``sys.exit`` exits with its own status), 2 for a missing script.
    """
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ('-h', '--help'):
        print(f'{USAGE}\n\n{__doc__}')
        return 0 if argv else 2
    script = argv[0]
    if not osp.isfile(script):
        print(
            f'python -m mmnanguard: script {script!r} does not exist\n'
            f'{USAGE}',
            file=sys.stderr,
        )
        return 2
    run_script(script, argv[1:])
    return 0


if __name__ == '__main__':
    sys.exit(main())
