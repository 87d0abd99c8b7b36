# Copyright (c) mmnanguard contributors. All rights reserved.
"""The check of the parameters after a step, queued as a device flag and
read with the next step's verdict (or now, before a checkpoint). The
buffers, which the forward writes, are checked before the step
(:mod:`.forward_buffers`)."""

from typing import Optional, Sequence, Tuple

import torch
from mmengine import dist
from torch import Tensor

from .dtensor import local
from .finite import any_nonfinite
from .loss_window import read_dtype


class ParamsCheck:
    """Queues the finiteness flag of the parameters (this rank's shards)
    after a step.

    Args:
        interval (int): Check after every this many steps (0: only when
            asked, for a snapshot that is due).
    """

    def __init__(self, interval: int = 1):
        self.interval = interval
        #: The queued flag (0-dim bool on the device), or None.
        self.flag: Optional[Tensor] = None
        #: The iteration whose step the queued flag checks.
        self.iteration: Optional[int] = None

    def due(self, iteration: int) -> bool:
        """Whether the interval asks for a check after ``iteration``."""
        return self.interval > 0 and (iteration + 1) % self.interval == 0

    def queue(self, tensors: Sequence[Tensor], iteration: int) -> None:
        """Queue the check of ``tensors`` (parameters, and buffers for the
        state training starts from) after the step of ``iteration`` (joined
        with a check queued before and not read)."""
        tensors = [local(t.detach()) for t in tensors if t.is_floating_point()]
        if not tensors:
            return
        flag = any_nonfinite(tensors)
        if self.flag is not None:
            flag = flag | self.flag.to(flag.device)
        self.flag = flag
        self.iteration = iteration

    def take(self) -> Tuple[Optional[Tensor], Optional[int]]:
        """The queued flag and its iteration, handed to a read and
        forgotten here; ``(None, None)`` when none was queued."""
        flag, iteration = self.flag, self.iteration
        if flag is None:
            return None, None
        self.flag = None
        return flag, iteration

    def forget(self) -> None:
        """Drop the queued check (a rollback restored a known-good state)."""
        self.flag = None
        self.iteration = None

    @property
    def pending(self) -> Optional[int]:
        """The iteration whose check is not read yet, or None."""
        return None if self.flag is None else self.iteration

    def read_now(self) -> Optional[Tuple[bool, bool]]:
        """Read the queued check now (one read, and one ``all_reduce`` under
        ``torch.distributed``: before a checkpoint or at the end of
        training).

        Returns:
            tuple[bool, bool] | None: Whether the parameters were finite
            on every rank (agreed) and on this rank alone; None when no
            check was queued.
        """
        flag, _ = self.take()
        if flag is None:
            return None
        own = flag.to(read_dtype(flag.device)).reshape(1)
        votes = own.clone()
        if dist.get_world_size() > 1:
            dist.all_reduce(votes, op='sum')
        agreed_bad, own_bad = torch.cat([votes, own]).tolist()
        return not agreed_bad, not own_bad
