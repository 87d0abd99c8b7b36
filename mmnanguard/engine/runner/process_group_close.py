# Copyright (c) mmnanguard contributors. All rights reserved.
"""End the process group of a finished run on every rank together.

A rank that destroys its gloo group while a peer is still working (rank 0
writing the last checkpoint, which mmengine does on rank 0 alone) can be
aborted by gloo ("terminate called without an active exception"), and a
group left to the interpreter's exit can abort the same way. After a run
that completed on every rank, a barrier first lets every rank arrive; after
a failure no barrier is waited on (a peer may never arrive), the group is
only destroyed.

Even then, a rank of a run that completed could still abort after its
last line of Python: "terminate called without an active exception" while
the interpreter finalized, no Python frame on any thread (gloo under FSDP1
and FSDP2 on CPUs, 1 run in 10 of a 2-process toy run; exit -6, so
``torchrun`` reported a finished run as failed). :func:`exit_process` ends
such a process with its status, logs flushed, without the finalization.
"""

import logging
import os
import sys


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


def exit_process(status: int) -> None:
    """End a rank of a distributed run with ``status``, now.

    The log handlers are flushed and closed and the standard streams
    flushed, then the process exits without the interpreter's
    finalization (where gloo's threads can abort it, see the module
    docstring). Every file the run
    writes is complete by then (checkpoints are synced when written;
    mmengine's ``LoggerHook`` closes the visualizer after the run). A run
    of one process, with ``WORLD_SIZE`` unset or 1, exits as usual
    (``sys.exit``).

    Args:
        status (int): The exit status.
    """
    if int(os.environ.get('WORLD_SIZE', '1') or 1) <= 1:
        sys.exit(status)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or a broken pipe
            pass
    os._exit(status)
