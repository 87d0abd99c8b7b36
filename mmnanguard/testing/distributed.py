# Copyright (c) mmnanguard contributors. All rights reserved.
"""Start multi-process CPU (gloo) runs for the distributed tests, and read
what each rank left."""

import contextlib
import glob
import json
import os.path as osp
import socket
from typing import Dict, Iterator, List, Tuple


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


@contextlib.contextmanager
def one_rank_group() -> Iterator[None]:
    """A gloo process group of one rank in this process (an in-memory
    store), destroyed on exit: collectives of sharded wrappers run without
    starting processes.

    Raises:
        RuntimeError: A process group is already running here.
    """
    import torch.distributed as torch_dist

    if torch_dist.is_initialized():
        raise RuntimeError('a process group is already running here')
    torch_dist.init_process_group(
        'gloo', store=torch_dist.HashStore(), rank=0, world_size=1
    )
    try:
        yield
    finally:
        torch_dist.destroy_process_group()


def incidents_by_rank(
    work_dir: str, ranks: int = 2
) -> Dict[int, List[Tuple[int, str, str]]]:
    """``(iteration, kind, action)`` of every incident folder in
    ``work_dir/nanguard``, in folder order, by the rank that wrote it.

    Args:
        work_dir (str): The run's work dir.
        ranks (int): The world size. Defaults to 2.

    Returns:
        dict: rank -> list of ``(iteration, kind, action)``.
    """
    by_rank = {rank: [] for rank in range(ranks)}
    pattern = osp.join(str(work_dir), 'nanguard', '*', 'report.json')
    for path in sorted(glob.glob(pattern)):
        with open(path) as f:
            report = json.load(f)
        by_rank[report['rank']].append(
            (report['iteration'], report['kind'], report['action'])
        )
    return by_rank
