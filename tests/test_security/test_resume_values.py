# Copyright (c) mmnanguard contributors. All rights reserved.
"""What a crafted checkpoint may make a resumed run do: nothing outside
its checkpoint folder, and no value of the wrong form taken.

Every attack is resumed through ``tools/train.py`` (or, for
``save_best``, the real runner built from the same config) on real
checkpoints of one 3-iteration run of the tiny RetinaNet COCO config
(``resume_runs.py``), crafted in a fresh work dir; every victim lies
outside that work dir and is asserted to be still there.
"""

import math
import os
import os.path as osp
import shutil
import uuid

import pytest
import torch
from mmengine.config import Config
from mmengine.hooks import CheckpointHook
from mmengine.registry import RUNNERS
from resume_runs import (
    crafted_copy,
    load,
    load_tool,
    run_log,
    train,
    trained_run,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope='module')
def run(tmp_path_factory, tiny_coco_root):
    """The trained run (``tool``, ``config``, ``work_dir``)."""
    folder = str(tmp_path_factory.mktemp('resume_values'))
    return trained_run(folder, tiny_coco_root)


@pytest.fixture
def layout(tmp_path):
    """``outside`` (for the victims) and ``work`` two levels below it."""
    outside = tmp_path / 'outside'
    work = outside / 'runs' / 'work'
    work.mkdir(parents=True)
    return dict(outside=str(outside), work=str(work))


def _set_info(**info):
    def craft(checkpoint):
        checkpoint['message_hub']['runtime_info'].update(info)

    return craft


def _resumed(run, work, capsys, option):
    """``tools/train.py --resume --cfg-options OPTION`` on ``work``: exit
    0."""
    code = train(
        run['tool'], run['config'], work, '--resume', '--cfg-options', option
    )
    assert code == 0, capsys.readouterr().err


def _refused(run, work, capsys, *extra):
    """``tools/train.py --resume EXTRA`` on ``work``: exit 2 and one
    paragraph without a traceback; returns it."""
    code = train(run['tool'], run['config'], work, '--resume', *extra)
    err = capsys.readouterr().err
    assert code == 2
    assert 'Traceback' not in err and len(err.strip().splitlines()) == 1
    return err


def test_keep_ckpt_ids_with_path_parts_remove_no_folder(run, layout, capsys):
    """mmengine removes ``keep_ckpt_ids`` beyond ``max_keep_ckpts`` at
    ``before_train``: ``iter_/../../../victim`` with an ``iter_`` folder in
    the work dir named a folder outside, which it removed with
    ``rmtree``."""
    work = layout['work']
    victim = osp.join(layout['outside'], 'victim.pth')
    os.makedirs(victim)
    with open(osp.join(victim, 'data.txt'), 'w') as f:
        f.write('keep me')
    os.makedirs(osp.join(work, 'iter_'))
    ids = ['/../../../victim', 2, 3]
    newest = crafted_copy(run, work, _set_info(keep_ckpt_ids=ids))
    _resumed(run, work, capsys, 'default_hooks.checkpoint.max_keep_ckpts=2')
    assert osp.isfile(osp.join(victim, 'data.txt'))
    log = run_log(work)
    assert (
        f'the checkpoint {newest!r} holds message_hub.runtime_info.'
        "keep_ckpt_ids=['/../../../victim', 2, 3]; dropped: "
        "'/../../../victim' is not an int in [0, 3]"
    ) in log
    # the ids that are files of the rotation stay, within max_keep_ckpts
    for step in (1, 2, 3):
        assert osp.isfile(osp.join(work, f'iter_{step}.pth'))


def test_keep_ckpt_id_beyond_the_resumed_step_is_not_removed(
    run, layout, capsys
):
    """``keep_ckpt_ids=[1000, 1, 2, 3]`` removed a complete
    ``iter_1000.pth`` the rotation never held; the ids the rotation did
    hold are still rotated (``iter_1.pth`` goes, ``max_keep_ckpts=2``)."""
    work = layout['work']
    newest = crafted_copy(run, work, _set_info(keep_ckpt_ids=[1000, 1, 2, 3]))
    planted = osp.join(work, 'iter_1000.pth')
    shutil.copyfile(osp.join(run['work_dir'], 'iter_1.pth'), planted)
    os.utime(planted, (1, 1))  # older: iter_3.pth stays the newest
    _resumed(run, work, capsys, 'default_hooks.checkpoint.max_keep_ckpts=2')
    assert osp.isfile(planted)
    assert not osp.exists(osp.join(work, 'iter_1.pth'))  # rotated out
    assert osp.isfile(osp.join(work, 'iter_2.pth'))
    assert osp.isfile(newest)
    assert '1000 is not an int in [0, 3]' in run_log(work)


def test_best_ckpt_outside_is_not_removed_by_save_best(run, layout):
    """``best_ckpt`` naming a file outside and ``best_score=-1e30``: the
    first validation after the resume removed that file ("The previous
    best checkpoint .../victim.txt is removed"). The runner is the one
    ``tools/train.py`` builds from the config (with ``save_best``); the
    validation is the ``CheckpointHook``'s part of the call ``ValLoop.run``
    ends with (the tiny config has no validation data)."""
    work = layout['work']
    victim = osp.join(layout['outside'], 'victim.txt')
    with open(victim, 'w') as f:
        f.write('keep me')
    newest = crafted_copy(
        run, work, _set_info(best_ckpt=victim, best_score=-1e30)
    )
    cfg = Config.fromfile(run['config'])
    cfg.work_dir = work
    cfg.resume = True
    cfg.experiment_name = f'best_ckpt_attack_{uuid.uuid4().hex[:8]}'
    cfg.default_hooks.checkpoint.save_best = 'coco/bbox_mAP'
    cfg.default_hooks.checkpoint.rule = 'greater'
    runner = RUNNERS.build(cfg)
    runner.train()  # resumes at iteration 3 of 3: nothing trained
    assert runner.iter == 3
    (hook,) = [h for h in runner.hooks if isinstance(h, CheckpointHook)]
    hook.after_val_epoch(runner, metrics={'coco/bbox_mAP': 0.25})
    assert osp.isfile(victim)
    best = osp.join(work, 'best_coco_bbox_mAP_iter_3.pth')
    assert osp.isfile(best)
    hub = runner.message_hub
    assert hub.get_info('best_ckpt') == best
    assert hub.get_info('best_score') == 0.25
    log = run_log(work)
    assert (
        f'the checkpoint {newest!r} holds message_hub.runtime_info.'
        f'best_ckpt={victim!r}; dropped: its file name does not match'
    ) in log
    assert 'The previous best checkpoint' not in log


@pytest.mark.parametrize(
    'keys, value, said',
    [
        (
            ('nanguard', 'lr_backoff', 'multiplier'),
            math.nan,
            'nanguard.lr_backoff.multiplier is nan (float); expected a '
            'finite number in (0, 1]',
        ),
        (
            ('meta', 'iter'),
            '3',
            "meta.iter is '3' (str); expected an int >= 0",
        ),
    ],
)
def test_value_of_the_wrong_form_is_refused(
    run, layout, capsys, keys, value, said
):
    """``nanguard.lr_backoff.multiplier=NaN`` made every lr NaN and the
    run learned nothing (exit 0); ``meta.iter='3'`` ended in a
    ``TypeError`` (exit 1). Now exit 2, one paragraph naming the file and
    the key (the guard's other values: ``test_guard_state.py``)."""
    work = layout['work']

    def craft(checkpoint):
        section = checkpoint
        for key in keys[:-1]:
            section = section[key]
        section[keys[-1]] = value

    newest = crafted_copy(run, work, craft, steps=[3])
    err = _refused(run, work, capsys)
    assert f'cannot resume from {newest!r}: {said}' in err


def test_nul_byte_in_last_checkpoint_is_refused(run, layout, capsys):
    """A NUL byte ended in ``ValueError: embedded null byte`` (exit 1);
    the other hostile ``last_checkpoint`` files:
    ``test_resume_files.py``."""
    work = layout['work']
    crafted_copy(run, work, steps=[3])
    marker = osp.join(work, 'last_checkpoint')
    with open(marker, 'wb') as f:
        f.write(b'iter_3\x00.pth')
    err = _refused(run, work, capsys)
    assert f'cannot resume: {marker!r} holds a NUL byte (at 6)' in err


def test_resume_from_a_device_says_not_a_regular_file(run, layout, capsys):
    """``/dev/zero`` given as ``--resume`` was refused with "does not
    exist"."""
    err = _refused(run, layout['work'], capsys, '/dev/zero')
    assert "cannot resume from '/dev/zero': it is not a regular file" in err
    assert 'does not exist' not in err


def test_newest_checkpoint_that_does_not_fit_is_passed_over(
    run, layout, capsys
):
    """The newest checkpoint loads but its optimizer has a param group
    more (another config wrote it): the resume crashed in
    ``optimizer.load_state_dict`` (exit 1). Now it is passed over with a
    warning and the next older one is resumed, weights and all."""
    work = layout['work']

    def craft(checkpoint):
        groups = checkpoint['optimizer']['param_groups']
        groups.append(dict(groups[0], params=[]))

    newest = crafted_copy(run, work, craft, steps=[2, 3])
    _resumed(run, work, capsys, 'train_cfg.max_iters=2')
    log = run_log(work)
    older = osp.join(work, 'iter_2.pth')
    assert f'resuming from {older!r}, the newest checkpoint that loads' in log
    assert (
        f'{newest!r}: it does not fit the model or optimizer: its '
        "'optimizer' has 2 param groups, the optimizer 1"
    ) in log
    assert 'resumed epoch: 0, iter: 2' in log
    # the weights resumed are iter_2's: the rerun wrote nothing new
    saved = load(older)['state_dict']
    reference = load(osp.join(run['work_dir'], 'iter_2.pth'))['state_dict']
    assert saved.keys() == reference.keys()
    for name in reference:
        assert torch.equal(saved[name], reference[name]), name


def test_shape_mismatch_with_no_older_fitting_checkpoint_is_refused(
    run, layout, capsys
):
    """A tensor of another shape was skipped with a warning (mmengine's
    ``strict=False``) and trained from its initial value; with no
    checkpoint that fits, the resume stops rather than start from scratch
    over the work dir's checkpoints."""
    work = layout['work']

    def craft(checkpoint):
        state = checkpoint['state_dict']
        name = next(k for k, v in state.items() if v.dim() == 4)
        state[name] = torch.zeros(1, 1, 1, 1)

    newest = crafted_copy(run, work, craft, steps=[3])
    err = _refused(run, work, capsys)
    assert f'no checkpoint in {work!r} fits this run: {newest!r}' in err
    assert 'has shape (1, 1, 1, 1), the model' in err


def test_doctor_names_a_last_checkpoint_that_is_not_utf8(run, layout, capsys):
    """The doctor said "invalid configuration" for a non-UTF-8
    ``last_checkpoint`` (a ``UnicodeDecodeError`` blamed on the config)
    and read it with no size limit."""
    doctor = load_tool('doctor')
    marker = osp.join(layout['work'], 'last_checkpoint')
    with open(marker, 'wb') as f:
        f.write(b'\xff\xfeiter_3.pth')
    code = doctor.main(
        [
            run['config'],
            '--cfg-options',
            'resume=True',
            f'work_dir={layout["work"]}',
        ]
    )
    out = capsys.readouterr()
    assert code == 1  # an error-level finding, not a bad invocation (2)
    assert 'invalid configuration' not in out.err
    assert (
        f'[error] unreadable-last-checkpoint (resume): resume=True reads '
        f'{marker!r} is not UTF-8 text (byte 0)'
    ) in out.out


def test_meta_config_is_never_run(run, layout, capsys):
    """mmengine's resume evaluates ``meta.config`` as a Python config
    (``Config.fromstring``) to read ``gpu_ids``: a crafted one ran a
    shell command at ``--resume``."""
    work = layout['work']
    marker = osp.join(layout['outside'], 'ran')
    code = (
        f"ran = __import__('os').system('touch {marker}')\ngpu_ids = [0]\n"
        "model = dict(type='RetinaNet')\n"
    )

    def craft(checkpoint):
        checkpoint['meta']['config'] = code

    crafted_copy(run, work, craft, steps=[3])
    _resumed(run, work, capsys, 'train_cfg.max_iters=3')
    assert not osp.exists(marker)
    assert 'resumed epoch: 0, iter: 3' in run_log(work)
