# Copyright (c) mmnanguard contributors. All rights reserved.
"""Mend: a fresh store namespace for each round of a torch elastic job.

Under ``torchrun`` with the c10d rendezvous, the workers' ``env://`` store
is the agent's shared TCPStore (``TORCHELASTIC_USE_AGENT_STORE=True``). The
rank-0 agent keeps that server for its whole life, and torch (2.13 here)
does not put the round into the workers' key names. When a node's
worker dies and the group restarts, the keys of the previous round's
process group are still there: a worker of the new round reads its peer's
old gloo address before the peer has written its new one and fails with
``Connection refused`` (``connectFullMesh``), which uses up
``--max-restarts``. ``TORCHELASTIC_RESTART_COUNT`` cannot tell the rounds
apart: an agent whose own workers were healthy restarts them for the
membership change without counting a restart, so the two nodes' workers see
different counts in the same round.

:func:`round_store` lets the workers of one round agree on a namespace that
no earlier round can have written: rank 0 publishes a new random token,
every other rank checks in under the token it read, with a random token of
its own, and is welcomed under that pair of tokens only by a live rank 0.
A rank that read an earlier round's token gets no welcome and reads again.
Agents started with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` give each round
a new store on rank 0's worker; then this mend does nothing.
"""

import os
import time
import uuid
from datetime import timedelta
from typing import Optional

import torch.distributed as torch_dist

ROOT = 'nanguard/elastic_round'
RETRY_S = 1.0


def uses_agent_store() -> bool:
    """Whether this worker was started by a torch elastic agent whose
    store the process group would share across restarts."""
    return os.environ.get('TORCHELASTIC_USE_AGENT_STORE') == 'True'


def _agree(store, rank: int, world_size: int, timeout: timedelta) -> str:
    """The namespace of this round, agreed by every rank through ``store``
    (see the module's docstring)."""
    own = uuid.uuid4().hex
    if rank == 0:
        store.set(f'{ROOT}/leader', own)
        for peer in range(1, world_size):
            joined = f'{ROOT}/{own}/joined/{peer}'
            store.wait([joined], timeout)
            token = store.get(joined).decode()
            store.set(f'{ROOT}/{own}/welcome/{token}', b'1')
        return f'{ROOT}/{own}/'
    deadline = time.monotonic() + timeout.total_seconds()
    while True:
        leader = store.get(f'{ROOT}/leader').decode()
        store.set(f'{ROOT}/{leader}/joined/{rank}', own)
        try:
            store.wait(
                [f'{ROOT}/{leader}/welcome/{own}'], timedelta(seconds=RETRY_S)
            )
            return f'{ROOT}/{leader}/'
        except torch_dist.DistStoreError:  # an earlier round's token, or early
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f'nanguard: rank {rank} got no answer from rank 0 on the '
                    f'store {os.environ.get("MASTER_ADDR")}:'
                    f'{os.environ.get("MASTER_PORT")} within '
                    f'{timeout.total_seconds():.0f} s; is every node of '
                    'the job started?'
                ) from None


def round_store(timeout: Optional[timedelta] = None):
    """The agent's store with a namespace of this round's own.

    Args:
        timeout (timedelta, optional): How long to wait for the other ranks;
            default torch's process-group default (30 minutes).

    Returns:
        tuple: ``(store, rank, world_size)`` for ``init_process_group``.
    """
    timeout = timeout or timedelta(minutes=30)
    rank = int(os.environ['RANK'])
    world_size = int(os.environ['WORLD_SIZE'])
    store = torch_dist.TCPStore(
        host_name=os.environ['MASTER_ADDR'],
        port=int(os.environ['MASTER_PORT']),
        is_master=False,
        timeout=timeout,
    )
    prefix = _agree(store, rank, world_size, timeout)
    return torch_dist.PrefixStore(prefix, store), rank, world_size


def init_process_group(backend: str) -> None:
    """Start the default process group from torchrun's environment, in a
    namespace of this round when a torch elastic agent shares its store.

    Args:
        backend (str): ``'gloo'`` or ``'nccl'``.
    """
    if not uses_agent_store():
        torch_dist.init_process_group(backend=backend)
        return
    store, rank, world_size = round_store()
    torch_dist.init_process_group(
        backend=backend, store=store, rank=rank, world_size=world_size
    )
