# Copyright (c) mmnanguard contributors. All rights reserved.
"""A real kill -9 right after a mid-epoch checkpoint, then
``tools/train.py CONFIG --resume``: the run ends with the weights and
optimizer state of the same run never interrupted, every tensor
``torch.equal``.

``tools/train.py`` trains the tiny rotated RetinaNet (upstream mmrotate
config, shrunk; 8 generated images; shuffled ``DefaultSampler``,
``RandomFlip``; a checkpoint after every iteration, 2 loader workers per
process), in one process (2 epochs of 4 iterations) and under DDP with 2
processes started by ``torchrun`` (gloo; 4 epochs of 2 iterations). A
hook of the config (``KILL_AT`` in the environment) sends rank 0 SIGKILL
once the checkpoint of iteration ``KILL_AT`` (the middle of an epoch) is
on disk: no handler runs, the workers are orphaned, nothing is flushed;
under DDP rank 1 then fails in its next collective. The resume reads that
checkpoint (the newest complete one), continues the epoch at its next
batch, and writes ``iter_8.pth``, which is compared with the
uninterrupted run's.
"""

import os
import signal
import sys

import pytest
import torch
from exact_resume_runs import differing_tensors, resume_config
from integration_utils import TRAIN, run_script

from mmnanguard.testing.distributed import free_port, torchrun_args

#: launcher -> the iteration after whose checkpoint rank 0 is killed, and
#: the batch of its epoch the resume continues at
KILLS = {
    'none': (6, 'batch 3 of epoch 2'),
    'pytorch': (5, 'batch 2 of epoch 3'),
}

#: The module of the hook that kills the run (imported by the config).
KILLER = '''\
import os
import os.path as osp
import signal

from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class KillAfterCheckpoint(Hook):
    """SIGKILL rank 0 once the checkpoint of the iteration that the
    environment's KILL_AT names is written (after every other hook)."""

    priority = 'LOWEST'

    def after_train_iter(self, runner, batch_idx, data_batch=None,
                         outputs=None):
        at = int(os.environ.get('KILL_AT', '0'))
        if at and runner.iter + 1 == at and get_rank() == 0:
            saved = runner.message_hub.get_info('last_ckpt')
            assert osp.basename(saved) == f'iter_{at}.pth', saved
            os.kill(os.getpid(), signal.SIGKILL)
'''

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not sys.platform.startswith('linux'), reason='SIGKILL: Linux'
    ),
]


def _config(tmp_path, name, data_root, launcher) -> str:
    """Write the run's config (2 loader workers, the killer hook; under
    DDP 4 epochs of 2 iterations)."""
    cfg = resume_config(str(tmp_path / name), data_root, 'epoch', 2)
    if launcher != 'none':
        cfg.train_cfg.max_epochs = 4
    cfg.custom_imports = dict(
        imports=['kill_after_checkpoint'], allow_failed_imports=False
    )
    cfg.custom_hooks = [dict(type='KillAfterCheckpoint')]
    path = str(tmp_path / f'{name}.py')
    cfg.dump(path)
    return path


def _train(config, tmp_path, launcher, *extra, kill_at=0):
    args = [TRAIN, config, *extra]
    if launcher != 'none':
        args = torchrun_args(2, free_port()) + [*args, '--launcher', launcher]
    env = dict(
        PYTHONPATH=os.pathsep.join(
            [str(tmp_path), os.environ.get('PYTHONPATH', '')]
        ),
        KILL_AT=str(kill_at),
        OMP_NUM_THREADS='1',
    )
    return run_script(args, timeout=400, env=env)


def _final(work_dir) -> dict:
    return torch.load(
        str(work_dir / 'iter_8.pth'), map_location='cpu', weights_only=False
    )


@pytest.mark.parametrize('launcher', list(KILLS))
def test_kill_9_after_a_checkpoint_then_resume_is_bit_identical(
    launcher, tiny_dota_root, tmp_path
):
    kill_at, continues_at = KILLS[launcher]
    (tmp_path / 'kill_after_checkpoint.py').write_text(KILLER)

    def config(name):
        return _config(tmp_path, name, tiny_dota_root, launcher)

    whole = _train(config('whole'), tmp_path, launcher)
    assert whole.returncode == 0, (whole.stdout + whole.stderr)[-4000:]

    broken_config = config('broken')
    killed = _train(broken_config, tmp_path, launcher, kill_at=kill_at)
    if launcher == 'none':
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-4000:]
    else:  # torchrun reports the failed worker group
        assert 'Signal 9 (SIGKILL)' in killed.stderr, killed.stderr[-4000:]
    broken = tmp_path / 'broken'
    assert (broken / f'iter_{kill_at}.pth').is_file()
    assert not (broken / f'iter_{kill_at + 1}.pth').exists()

    resumed = _train(broken_config, tmp_path, launcher, '--resume')
    log = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, log[-4000:]
    assert (
        f'nanguard: resumed at iteration {kill_at}: continues at '
        f'{continues_at} without loading the trained batches; random '
        'generators restored'
    ) in log, log[-4000:]

    expected, got = _final(tmp_path / 'whole'), _final(broken)
    assert got['meta']['iter'] == expected['meta']['iter'] == 8
    assert differing_tensors(expected['state_dict'], got['state_dict']) == []
    for key, state in expected['optimizer']['state'].items():
        assert differing_tensors(state, got['optimizer']['state'][key]) == []
