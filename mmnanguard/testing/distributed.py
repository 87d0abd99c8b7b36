# Copyright (c) mmnanguard contributors. All rights reserved.
"""Start multi-process CPU (gloo) runs for the distributed tests."""

import socket
from typing import List


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS picks
    it; never a fixed port, so parallel runs do not collide)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def torchrun_args(nproc: int, port: int) -> List[str]:
    """``python -m torch.distributed.run`` arguments for ``nproc`` local
    processes with the rendezvous on ``127.0.0.1:port``.

    Args:
        nproc (int): Processes on this machine.
        port (int): A free port (:func:`free_port`).

    Returns:
        list[str]: The arguments after ``python``.
    """
    return [
        '-m',
        'torch.distributed.run',
        '--nproc_per_node',
        str(nproc),
        '--master_addr',
        '127.0.0.1',
        '--master_port',
        str(port),
    ]
