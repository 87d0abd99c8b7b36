# Copyright (c) mmnanguard contributors. All rights reserved.
"""Two ``torchrun`` agents on one machine stand in for two nodes
(``--nnodes 2 --nproc_per_node 1``, c10d rendezvous on 127.0.0.1 at a free
port, ``--max-restarts 2``), each running
``tools/train.py --launcher pytorch --guard skip --resume`` on the tiny
rotated RetinaNet, faults planted on node 1 (global rank 1) only:

* iteration 1: a NaN in rank 1's momentum -> its weights turn NaN, the
  agreed parameter check rolls both ranks back, learning rates x0.5
  (incident 000);
* after ``epoch_1.pth`` is durable, node 1's worker is killed (SIGKILL):
  torch elastic restarts the group, ``--resume`` continues from the newest
  durable checkpoint;
* iteration 5 (after the restart): a NaN gradient on rank 1 -> skipped on
  both ranks (incident 001: the numbering continues).

The guard's counters, incident numbering and lr backoff continue across
the restart; both agents exit 0; the final checkpoint's weights are finite.

A restarted group must not read the previous round's keys in the agent's
store (:mod:`mmnanguard.compat.elastic_round`): the second test restarts a
toy gloo group the same way, rank 1 starting 3 s late.
"""

import glob
import json
import os
import os.path as osp
import re
import signal
import subprocess
import sys
import time

import pytest
import torch
from integration_utils import REPO, TRAIN

from mmnanguard.testing.distributed import free_port

TINY_DOTA = osp.join(
    REPO, 'configs', 'tiny', 'rotated-retinanet-rbox-le90_r18_tiny-dota.py'
)

pytestmark = pytest.mark.slow


ROUND_WORKER = osp.join(
    osp.dirname(osp.abspath(__file__)), 'elastic_round_worker.py'
)


def _train_args(config: str, work: str):
    return [
        TRAIN,
        config,
        '--launcher',
        'pytorch',
        '--guard',
        'skip',
        '--resume',
        '--work-dir',
        work,
    ]


def _agent(port: int, script_args, log_path: str, max_restarts: int = 2):
    args = [
        sys.executable,
        '-m',
        'torch.distributed.run',
        '--nnodes',
        '2',
        '--nproc_per_node',
        '1',
        '--rdzv-backend',
        'c10d',
        '--rdzv-endpoint',
        f'127.0.0.1:{port}',
        '--rdzv-id',
        'nanguard-elastic-test',
        '--max-restarts',
        str(max_restarts),
        '--monitor-interval',
        '0.5',
        *script_args,
    ]
    env = dict(
        os.environ,
        OMP_NUM_THREADS='1',
        PYTHONWARNINGS='ignore',
        LOGLEVEL='INFO',
    )
    log = open(log_path, 'w')
    # a session of its own: the test ends the agent and its workers together
    return subprocess.Popen(
        args,
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    ), log


def _children(pid: int):
    try:
        with open(f'/proc/{pid}/task/{pid}/children') as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def _rank_of(pid: int):
    try:
        with open(f'/proc/{pid}/environ', 'rb') as f:
            env = dict(
                item.split(b'=', 1)
                for item in f.read().split(b'\0')
                if b'=' in item
            )
    except OSError:
        return None
    rank = env.get(b'RANK')
    return None if rank is None else int(rank)


def _worker_of_rank(agents, rank: int):
    for agent in agents:
        for child in _children(agent.pid):
            if _rank_of(child) == rank:
                return child
    return None


def _finish(started, deadline: float):
    """Wait for the agents until ``deadline``, then end each agent and every
    worker it started; return the agents' exit codes (None: ended here)."""
    codes = []
    for agent, _ in started:
        try:
            codes.append(agent.wait(max(1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            codes.append(None)
    for agent, log in started:
        try:  # the agent's session: the agent and its workers
            os.killpg(agent.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        agent.wait()
        log.close()
    return codes


def test_two_agents_killed_node_restarts_and_resumes(tiny_dota_root, tmp_path):
    config = tmp_path / 'elastic.py'
    config.write_text(
        f'_base_ = {TINY_DOTA!r}\n'
        "custom_imports = dict(imports=['mmnanguard.testing'],"
        ' allow_failed_imports=False)\n'
        'custom_hooks = [\n'
        "    dict(type='FaultInjectionHook', fault='nan_optimizer_state',"
        ' iteration=1, rank=1),\n'
        "    dict(type='FaultInjectionHook', fault='nan_grad', iteration=5,"
        ' rank=1),\n'
        ']\n'
        'train_cfg = dict(max_epochs=4)\n'
        'optim_wrapper = dict(optimizer=dict(momentum=0.9))\n'
        'train_dataloader = dict(dataset=dict('
        f'data_root={tiny_dota_root + "/"!r}))\n'
        "nanguard = dict(hooks=[])\n"
        'default_hooks = dict(checkpoint=dict(interval=1, max_keep_ckpts=5))\n'
    )
    work = str(tmp_path / 'work')
    port = free_port()
    logs = [str(tmp_path / f'agent{i}.log') for i in (0, 1)]
    started = [
        _agent(port, _train_args(str(config), work), logs[i]) for i in (0, 1)
    ]
    agents = [a for a, _ in started]
    killed = None
    deadline = time.monotonic() + 240
    try:
        # kill rank 1's worker once the first checkpoint is durable
        while time.monotonic() < deadline and killed is None:
            if osp.isfile(osp.join(work, 'last_checkpoint')):
                killed = _worker_of_rank(agents, 1)
                if killed is not None:
                    os.kill(killed, signal.SIGKILL)
                    break
            if any(a.poll() is not None for a in agents):
                break
            time.sleep(0.2)
    finally:
        codes = _finish(started, deadline)
    text = [open(p).read() for p in logs]
    both = text[0] + text[1]
    assert killed is not None, both[-6000:]
    assert codes == [0, 0], both[-6000:]
    # torch elastic restarted the group; the run resumed by itself
    assert 'will restart worker group' in both, both[-4000:]
    # one restart was enough: the restarted group connected at once
    assert '1/2 attempts left' not in both, both[-6000:]
    assert 'Connection refused' not in both, both[-6000:]
    assert 'nanguard: resuming from' in both, both[-4000:]
    # incidents: numbered on across the restart, the same on both ranks
    by_rank = {0: [], 1: []}
    own = {}  # (incident, rank) -> whether that rank saw the fault itself
    for path in sorted(
        glob.glob(osp.join(work, 'nanguard', '*', 'report.json'))
    ):
        report = json.load(open(path))
        number = int(osp.basename(osp.dirname(path)).split('_')[1])
        by_rank[report['rank']].append(
            (number, report['iteration'], report['kind'], report['action'])
        )
        own[number, report['rank']] = report['local_fault']
    assert by_rank[0] == by_rank[1], by_rank
    # the NaN weights were rank 1's alone (the NaN gradient of incident 001
    # reaches rank 0 through DDP's all-reduce)
    assert (own.get((0, 0)), own.get((0, 1))) == (False, True), own
    numbers = [n for n, *_ in by_rank[0]]
    assert numbers == [0, 1], by_rank
    assert by_rank[0][0][3] == 'rollback'
    assert by_rank[0][1][1:] == (5, 'nonfinite_grad', 'skip'), by_rank
    # the final checkpoint: counters and the lr backoff carried on
    final = torch.load(
        osp.join(work, 'epoch_4.pth'), map_location='cpu', weights_only=False
    )
    counters = final['nanguard']['counters']
    assert counters['incidents'] == 2 and counters['rollbacks'] == 1
    assert counters['skipped'] == 1 and counters['lr_backoffs'] == 1
    assert final['nanguard']['lr_backoff']['multiplier'] == 0.5
    for name, value in final['state_dict'].items():
        if value.is_floating_point():
            assert torch.isfinite(value).all(), name


def test_restarted_group_does_not_read_the_last_rounds_addresses(tmp_path):
    port = free_port()
    logs = [str(tmp_path / f'agent{i}.log') for i in (0, 1)]
    worker = [ROUND_WORKER, str(tmp_path / 'marker')]
    started = [_agent(port, worker, logs[i], max_restarts=1) for i in (0, 1)]
    codes = _finish(started, time.monotonic() + 150)
    both = open(logs[0]).read() + open(logs[1]).read()
    assert codes == [0, 0], both[-6000:]
    rounds = sorted(re.findall(r'^round (\d) (\d) (\S+)$', both, re.M))
    # the all-reduce gave 1 + 2 in both rounds; in the restarted round
    # rank 0's agent, which restarted a healthy worker for the membership
    # change, still says 0 restarts, rank 1's says 1: the restart count
    # cannot name the round
    assert rounds == [
        ('0', '0', '3'),
        ('0', '0', '3'),
        ('1', '0', '3'),
        ('1', '1', '3'),
    ], both[-6000:]
    assert 'Connection refused' not in both
