# Copyright (c) mmnanguard contributors. All rights reserved.
"""The files a protected resume reads before any checkpoint:
``last_checkpoint`` and the file named with ``--resume`` or
``load_from``. A hostile one is refused by name, what is wrong with it
said as such; a valid one is read as mmengine writes it."""

import os
import os.path as osp

import pytest

from mmnanguard.engine.runner.config_meta import strip_config_code
from mmnanguard.engine.runner.crash_safety import check_load_from
from mmnanguard.engine.runner.last_checkpoint_file import (
    read_checked_last_checkpoint,
)
from mmnanguard.engine.runner.resume_choice import (
    CheckpointValueError,
    UnusableCheckpointError,
    choose_resume_checkpoint,
)


def _write(path, content):
    with open(path, 'wb') as f:
        f.write(content)


@pytest.mark.parametrize(
    'content, problem',
    [
        (b'iter_3\x00.pth', 'holds a NUL byte (at 6)'),
        (b'work/\xff\xfeiter_3.pth', 'is not UTF-8 text (byte 5)'),
        (b'x' * 4097, 'holds 4097 bytes, more than the 4096 of a path'),
        ('fifo', 'is not a regular file'),
        ('link', 'is not a regular file'),
        ('folder', 'is not a regular file'),
    ],
)
def test_hostile_last_checkpoint_is_refused_by_name(
    tmp_path, content, problem
):
    work = str(tmp_path)
    marker = osp.join(work, 'last_checkpoint')
    if content == 'fifo':
        os.mkfifo(marker)  # a read would block
    elif content == 'link':
        target = osp.join(work, 'elsewhere')
        _write(target, b'iter_1.pth')
        os.symlink(target, marker)
    elif content == 'folder':
        os.mkdir(marker)
    else:
        _write(marker, content)
    with pytest.raises(CheckpointValueError) as err:
        choose_resume_checkpoint(work)
    message = str(err.value)
    assert message.startswith(f'nanguard: cannot resume: {marker!r} {problem}')
    assert 'expected one line of UTF-8 text' in message
    assert isinstance(err.value, UnusableCheckpointError)  # exit 2


@pytest.mark.parametrize(
    'content, named',
    [
        (b'/runs/a/iter_3.pth\n', '/runs/a/iter_3.pth'),
        (b'', ''),
        ('w/\u00e9t\u00e9/iter_1.pth'.encode(), 'w/\u00e9t\u00e9/iter_1.pth'),
        (b'x' * 4096, 'x' * 4096),
    ],
)
def test_valid_last_checkpoint_is_read(tmp_path, content, named):
    _write(str(tmp_path / 'last_checkpoint'), content)
    assert read_checked_last_checkpoint(str(tmp_path)) == (True, named)


def test_missing_last_checkpoint_is_no_error(tmp_path):
    assert read_checked_last_checkpoint(str(tmp_path)) == (False, '')


@pytest.mark.parametrize('kind', ['fifo', 'device'])
def test_resume_from_a_non_regular_file_says_so(tmp_path, kind):
    work = str(tmp_path / 'work')
    os.mkdir(work)
    if kind == 'fifo':
        path = str(tmp_path / 'ckpt.pth')
        os.mkfifo(path)
    else:
        path = '/dev/zero'
    with pytest.raises(UnusableCheckpointError) as err:
        choose_resume_checkpoint(work, path)
    message = str(err.value)
    assert f'cannot resume from {path!r}: it is not a regular file' in message
    assert 'does not exist' not in message
    with pytest.raises(UnusableCheckpointError) as err:
        check_load_from(path)
    assert str(err.value).startswith(
        f'nanguard: cannot load load_from={path!r}: it is not a regular file'
    )


@pytest.mark.parametrize(
    'text, kept',
    [
        ("gpu_ids = range(2)\nmodel = dict(type='X')\n", None),
        ('gpu_ids = [0, 1]\nlr = 0.1\n', 'gpu_ids = [0, 1]\n'),
        ('gpu_ids = (0,)\n', 'gpu_ids = [0]\n'),
        (
            "import os\nos.system('touch x')\ngpu_ids = [0]\n",
            'gpu_ids = [0]\n',
        ),
        ("gpu_ids = __import__('os').getpid()\n", None),
        ('gpu_ids = [True]\n', None),
        ('def (:\n', None),
        ('x = ' + '[' * 100000 + ']' * 100000 + '\n', None),
        (b'gpu_ids = [0]', None),
    ],
)
def test_meta_config_keeps_only_a_literal_gpu_ids(text, kept):
    checkpoint = dict(meta=dict(config=text, iter=3))
    strip_config_code(checkpoint)
    if kept is None:
        assert checkpoint['meta'] == dict(iter=3)
    else:
        assert checkpoint['meta'] == dict(config=kept, iter=3)
