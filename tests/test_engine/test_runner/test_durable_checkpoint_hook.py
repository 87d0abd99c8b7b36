# Copyright (c) mmnanguard contributors. All rights reserved.
"""The protected runner's checkpoint files: every save durable, then
``last_checkpoint``, and only then the removal of the outdated one
(``max_keep_ckpts``); a full disk loses nothing (toy runs)."""

import errno
import os
import os.path as osp

import pytest
from mmengine.hooks import CheckpointHook
from mmengine.runner import Runner

from mmnanguard.engine.runner import (
    DurableCheckpointHook,
    DurableWriteError,
    NanGuardRunner,
    PreemptionHook,
    durable_checkpoint,
    durable_checkpoint_hook,
)
from mmnanguard.engine.runner.durable_checkpoint import (
    BACKEND_NAME,
    durable_backend_args,
)
from mmnanguard.fileio import durable_file
from mmnanguard.testing.toy import toy_runner_cfg

PROTECTION = dict(
    policy='skip', hooks=[], check_labels=False, validate_annotations=None
)


def toy_runner(work_dir, max_iters=3, keep=-1, policy='skip', **kwargs):
    cfg = toy_runner_cfg(
        str(work_dir),
        max_iters=max_iters,
        nanguard=dict(PROTECTION, policy=policy),
        **kwargs,
    )
    cfg['default_hooks']['checkpoint'] = dict(
        type='CheckpointHook', interval=1, by_epoch=False, max_keep_ckpts=keep
    )
    return NanGuardRunner(**cfg)


def names(folder):
    return sorted(n for n in os.listdir(folder) if n.endswith('.pth'))


def test_hooks_of_a_protected_run_and_of_policy_off(tmp_path):
    runner = toy_runner(tmp_path / 'a')
    types = [type(h) for h in runner.hooks]
    assert DurableCheckpointHook in types and PreemptionHook in types
    assert CheckpointHook not in types
    off = toy_runner(tmp_path / 'b', policy='off')
    types = [type(h) for h in off.hooks]
    assert CheckpointHook in types
    assert DurableCheckpointHook not in types and PreemptionHook not in types


def test_own_checkpoint_hook_subclass_is_left_alone():
    class MyCheckpointHook(CheckpointHook):
        pass

    hook = MyCheckpointHook(interval=1)
    assert not DurableCheckpointHook.adopt(hook)
    assert type(hook) is MyCheckpointHook
    plain = CheckpointHook(interval=2, max_keep_ckpts=3)
    assert DurableCheckpointHook.adopt(plain)
    assert type(plain) is DurableCheckpointHook
    assert (plain.interval, plain.max_keep_ckpts) == (2, 3)


def test_backend_args_only_for_local_folders():
    durable = {'backend': BACKEND_NAME}
    assert durable_backend_args('work_dirs/x') == durable
    assert durable_backend_args('work_dirs/x', {'backend': 'local'}) == durable
    assert durable_backend_args('s3://bucket/x') is None
    petrel = {'backend': 'petrel', 'path_mapping': {}}
    assert durable_backend_args('work_dirs/x', petrel) is petrel
    assert durable_backend_args('work_dirs/x', None, {'backend': 'disk'}) is (
        None
    )


def test_removal_comes_after_the_save_and_last_checkpoint(
    tmp_path, monkeypatch
):
    work_dir = str(tmp_path)
    events = []
    real = durable_file.write_durable

    def spy(path, data):
        name = osp.basename(path)
        events.append(('write', name, names(work_dir)))
        real(path, data)
        if name == 'last_checkpoint':
            with open(path) as f:
                events.append(('names', osp.basename(f.read())))

    monkeypatch.setattr(durable_checkpoint, 'write_durable', spy)
    monkeypatch.setattr(durable_checkpoint_hook, 'write_durable', spy)
    runner = toy_runner(work_dir, max_iters=3, keep=1)
    runner.train()
    assert names(work_dir) == ['iter_3.pth']
    assert events == [
        ('write', 'iter_1.pth', []),
        ('write', 'last_checkpoint', ['iter_1.pth']),
        ('names', 'iter_1.pth'),
        # the previous checkpoint is still there while the new one is
        # written, and until last_checkpoint names the new one
        ('write', 'iter_2.pth', ['iter_1.pth']),
        ('write', 'last_checkpoint', ['iter_1.pth', 'iter_2.pth']),
        ('names', 'iter_2.pth'),
        ('write', 'iter_3.pth', ['iter_2.pth']),
        ('write', 'last_checkpoint', ['iter_2.pth', 'iter_3.pth']),
        ('names', 'iter_3.pth'),
    ]


def test_full_disk_during_a_save_loses_nothing(tmp_path, monkeypatch):
    work_dir = str(tmp_path)
    real_write_all = durable_file.write_all
    calls = []

    def full_disk_on_third_checkpoint(fd, data):
        calls.append(len(data))
        if len(calls) == 5:  # iter_1, last, iter_2, last, iter_3
            real_write_all(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write_all(fd, data)

    runner = toy_runner(work_dir, max_iters=4, keep=1)  # dumps the config
    monkeypatch.setattr(
        durable_file, 'write_all', full_disk_on_third_checkpoint
    )
    with pytest.raises(DurableWriteError) as info:
        runner.train()
    assert info.value.errno == errno.ENOSPC
    assert 'iter_3.pth' in str(info.value)
    # max_keep_ckpts=1 did not remove iter_2 before iter_3 was durable
    assert sorted(os.listdir(work_dir)) == sorted(
        n for n in os.listdir(work_dir) if not n.startswith('.')
    )
    assert names(work_dir) == ['iter_2.pth']
    with open(osp.join(work_dir, 'last_checkpoint')) as f:
        assert osp.basename(f.read()) == 'iter_2.pth'
    hook = next(h for h in runner.hooks if isinstance(h, CheckpointHook))
    assert list(hook.keep_ckpt_ids) == [2]
    assert osp.basename(runner.message_hub.get_info('last_ckpt')) == (
        'iter_2.pth'
    )


def test_bare_runner_is_unchanged(tmp_path):
    cfg = toy_runner_cfg(str(tmp_path), max_iters=2)
    runner = Runner(**cfg)
    assert not any(isinstance(h, DurableCheckpointHook) for h in runner.hooks)
