# Copyright (c) mmnanguard contributors. All rights reserved.
"""End the process group of a finished run on every rank together.

A rank that destroys its gloo group while a peer is still working (rank 0
writing the last checkpoint, which mmengine does on rank 0 alone) can be
aborted by gloo ("terminate called without an active exception"), and a
group left to the interpreter's exit can abort the same way. After a run
that completed on every rank, a barrier first lets every rank arrive; after
a failure no barrier is waited on (a peer may never arrive), the group is
only destroyed.
"""


def close_process_group(completed: bool) -> None:
    """Destroy the default process group, if one is running.

    Args:
        completed (bool): Whether this rank's run completed, so that every
            peer will reach the same barrier. ``False`` destroys the group
            without waiting.
    """
    import torch.distributed as torch_dist

    if not (torch_dist.is_available() and torch_dist.is_initialized()):
        return
    if completed:
        torch_dist.barrier()
    torch_dist.destroy_process_group()
