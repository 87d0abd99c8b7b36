# Copyright (c) mmnanguard contributors. All rights reserved.
"""The worker of the restart-round test: ``prepare_cpu_distributed`` under
two torch elastic agents, then one all-reduce. In the first round rank 1
dies after it; rank 0 stays healthy and outside any collective, so its
agent restarts it for the membership change without counting a restart.
In the next round rank 1 starts the group 3 s after rank 0: rank 0 reads
the store first.

Usage: ``elastic_round_worker.py MARKER`` (``MARKER`` is created when rank
1 dies); each round prints ``round RANK RESTART_COUNT SUM``.
"""

import os
import sys
import time

import torch
import torch.distributed as torch_dist
from mmengine.config import Config

from mmnanguard.compat.cpu_distributed import prepare_cpu_distributed

marker = sys.argv[1]
rank = int(os.environ['RANK'])
restarted = os.path.exists(marker)
if restarted and rank == 1:
    time.sleep(3)
prepare_cpu_distributed(Config(dict()), 'pytorch')
total = torch.tensor([rank + 1.0])
torch_dist.all_reduce(total)
restarts = os.environ['TORCHELASTIC_RESTART_COUNT']
print(f'round {rank} {restarts} {total.item():g}', flush=True)
if not restarted:
    if rank == 1:
        open(marker, 'w').close()
        os._exit(1)
    time.sleep(300)
torch_dist.destroy_process_group()
