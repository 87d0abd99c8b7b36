# Copyright (c) mmnanguard contributors. All rights reserved.
"""Kill -9, a full disk, SIGTERM and a truncated checkpoint in a protected
run of the tiny rotated RetinaNet, through ``tools/train.py``, then
``tools/train.py --resume``: no completed checkpoint is lost,
``last_checkpoint`` is complete or absent, and the resume continues from
the newest complete state with that checkpoint's weights.

The trials are the ones of ``benchmarks/crash_survival.py``
(``benchmarks/crash_trial.py``), at a quarter of the ResNet-18 width
(6 MB checkpoints). Each child process is forked from a server that
imported the stack once; the break comes at iteration 3, with a
checkpoint every iteration. One bare-mmengine trial (``--guard off``)
shows that the break point is real.
"""

import os.path as osp
import sys

import pytest

BENCHMARKS = osp.join(
    osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))), 'benchmarks'
)
sys.path.insert(0, BENCHMARKS)

from crash_trial import run_trial  # noqa: E402

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith('linux'), reason='SIGKILL trials: Linux'
)

#: trial -> (exit status of the broken run, iteration resumed at,
#: temporary file left by the break, or None)
EXPECTED = {
    # SIGKILL while iter_3.pth is half written: iter_2 is the newest
    'kill_in_save': (-9, 2, '.iter_3.pth.'),
    # the same with max_keep_ckpts=1: iter_2 was not removed before
    'kill_in_save_keep1': (-9, 2, '.iter_3.pth.'),
    # SIGKILL while last_checkpoint is rewritten: it still names iter_2,
    # and the complete iter_3 is taken
    'kill_writing_last_checkpoint': (-9, 3, '.last_checkpoint.'),
    # ENOSPC halfway through iter_3.pth, max_keep_ckpts=1: tools/train.py
    # stops with one paragraph (exit 5), iter_2 is kept and no partial file
    # is left
    'full_disk_keep1': (5, 2, None),
    # SIGTERM during iteration 3, checkpoints every 100 iterations: the
    # preemption save of iteration 3, exit 4
    'sigterm': (4, 3, None),
    # the newest checkpoint cut to half after the run: iter_2 is taken
    'truncated_newest': (0, 2, None),
}


@pytest.mark.parametrize('trial', list(EXPECTED))
@pytest.mark.slow
def test_protected_run_survives(trial, tiny_dota_root, tmp_path):
    exit_status, resumed_at, leftover = EXPECTED[trial]
    result = run_trial(
        trial, 'skip', str(tmp_path / trial), tiny_dota_root, narrow=True
    )
    assert result.first_exit == exit_status, result
    assert result.lost == [], result
    if trial != 'truncated_newest':  # no part under a checkpoint's name
        assert result.partial == [], result
    if trial == 'truncated_newest':  # damaged after the run, not by it
        assert result.last_checkpoint == 'names broken iter_3.pth', result
    else:
        assert result.last_checkpoint.startswith('complete'), result
    if leftover is None:
        assert result.leftovers == [], result
    else:  # the kill came in the middle of the durable write
        assert len(result.leftovers) == 1, result
        assert result.leftovers[0].startswith(leftover), result
    assert result.resume_exit == 0, result
    assert result.resumed_at == resumed_at, result
    assert result.weights_match is True, result
    assert result.leftovers_after_resume == [], result
    assert result.survived


#: Under ``FlexibleRunner`` (its strategy writes the checkpoints): trial ->
#: (exit status of the broken run, iteration resumed at, leftover)
FLEXIBLE_EXPECTED = {
    'kill_in_save': (-9, 2, '.iter_3.pth.'),
    'full_disk_keep1': (5, 2, None),
}


@pytest.mark.parametrize('trial', list(FLEXIBLE_EXPECTED))
@pytest.mark.slow
def test_protected_flexible_run_survives(trial, tiny_dota_root, tmp_path):
    """The same breaks in the checkpoint write of ``SingleDeviceStrategy``
    (``runner_type='FlexibleRunner'``, ``--guard skip``): the strategy
    fills a temporary file, renamed once complete."""
    exit_status, resumed_at, leftover = FLEXIBLE_EXPECTED[trial]
    result = run_trial(
        trial,
        'skip',
        str(tmp_path / trial),
        tiny_dota_root,
        narrow=True,
        flexible=True,
    )
    assert result.first_exit == exit_status, result
    assert result.lost == [], result
    assert result.last_checkpoint == 'complete (iter_2.pth)', result
    if leftover is None:
        assert result.leftovers == [], result
    else:
        assert len(result.leftovers) == 1, result
        assert result.leftovers[0].startswith(leftover), result
    assert result.partial == [], result
    assert result.resume_exit == 0, result
    assert result.resumed_at == resumed_at, result
    assert result.weights_match is True, result
    assert result.leftovers_after_resume == [], result


@pytest.mark.slow
def test_bare_flexible_runner_leaves_a_partial_checkpoint(
    tiny_dota_root, tmp_path
):
    """The same kill against bare ``FlexibleRunner``: half of
    ``iter_3.pth`` under its final name."""
    result = run_trial(
        'kill_in_save',
        'off',
        str(tmp_path / 'bare'),
        tiny_dota_root,
        narrow=True,
        flexible=True,
    )
    assert result.first_exit == -9 and result.leftovers == []
    assert result.partial == ['iter_3.pth'], result


@pytest.mark.slow
def test_bare_mmengine_loses_the_run(tiny_dota_root, tmp_path):
    """The same kill against bare mmengine: the break point is real."""
    result = run_trial(
        'kill_writing_last_checkpoint',
        'off',
        str(tmp_path / 'bare'),
        tiny_dota_root,
        narrow=True,
    )
    assert result.first_exit == -9
    assert result.last_checkpoint == 'empty'
    assert result.resume_exit != 0
    assert 'FileNotFoundError' in result.resume_error
    assert not result.survived
    assert result.leftovers == []  # mmengine writes in place


def test_train_tool_exit_status_for_an_unusable_resume(
    tiny_dota_root, tmp_path, capsys
):
    """``--resume CKPT`` where nothing loads: exit 2, one paragraph."""
    sys.path.insert(0, osp.join(osp.dirname(BENCHMARKS), 'tools'))
    import train

    from mmnanguard.testing import TINY_DOTA_CONFIG

    bad = tmp_path / 'iter_9.pth'
    bad.write_bytes(b'PK\x03\x04 cut short')
    code = train.main(
        [
            TINY_DOTA_CONFIG,
            '--work-dir',
            str(tmp_path / 'work'),
            '--guard',
            'skip',
            '--resume',
            str(bad),
            '--cfg-options',
            f'train_dataloader.dataset.data_root={tiny_dota_root}/',
        ]
    )
    err = capsys.readouterr().err
    assert code == train.EXIT_USAGE == 2
    assert err.startswith('tools/train.py: UnusableCheckpointError:')
    assert str(bad) in err and 'Nothing was trained.' in err
    assert 'Traceback' not in err
    assert train.EXIT_PREEMPTED == 4
