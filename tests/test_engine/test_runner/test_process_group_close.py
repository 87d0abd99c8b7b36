# Copyright (c) mmnanguard contributors. All rights reserved.
"""``close_process_group``: a barrier only after a completed run, the
group destroyed either way, nothing done without a group.
``exit_process``: a rank of a distributed run ends with its status, its
log and output flushed, without the interpreter's finalization.

The two-rank case (a rank that finishes while rank 0 still writes the
last checkpoint) runs in ``tests/test_distributed``: every worker there
ends through this function.
"""

import os
import subprocess
import sys

import pytest
import torch.distributed as torch_dist

from mmnanguard.engine.runner.process_group_close import close_process_group


@pytest.mark.parametrize('completed, barriers', [(True, 1), (False, 0)])
def test_barrier_only_after_a_completed_run(monkeypatch, completed, barriers):
    seen = []
    real_barrier = torch_dist.barrier
    monkeypatch.setattr(
        torch_dist, 'barrier', lambda *a, **k: seen.append(real_barrier())
    )
    torch_dist.init_process_group(
        'gloo', store=torch_dist.HashStore(), rank=0, world_size=1
    )
    try:
        close_process_group(completed)
        assert len(seen) == barriers
        assert not torch_dist.is_initialized()
    finally:
        if torch_dist.is_initialized():
            torch_dist.destroy_process_group()


def test_no_group_is_a_no_op(monkeypatch):
    assert not torch_dist.is_initialized()
    monkeypatch.setattr(
        torch_dist, 'barrier', lambda *a, **k: pytest.fail('barrier called')
    )
    close_process_group(True)
    assert not torch_dist.is_initialized()


SCRIPT = """
import atexit, logging, sys
from mmnanguard.engine.runner.process_group_close import exit_process
logging.basicConfig(filename=sys.argv[1], level=logging.INFO)
atexit.register(lambda: print('finalized', flush=True))
logging.getLogger('run').info('last line of the log')
print('printed without a flush', end='')
exit_process(3)
"""


@pytest.mark.parametrize('world_size, finalized', [('2', False), ('1', True)])
def test_exit_process_flushes_and_skips_finalization(
    tmp_path, world_size, finalized
):
    log = tmp_path / 'run.log'
    out = subprocess.run(
        [sys.executable, '-c', SCRIPT, str(log)],
        capture_output=True,
        text=True,
        env=dict(os.environ, WORLD_SIZE=world_size),
        timeout=60,
    )
    assert out.returncode == 3, out.stderr
    assert 'printed without a flush' in out.stdout
    assert ('finalized' in out.stdout) == finalized
    assert 'last line of the log' in log.read_text()
