# Copyright (c) mmnanguard contributors. All rights reserved.
"""Every tool, every bad input: exit status 2 and one paragraph on stderr
that names the value, the expected form and the file; no traceback.

Each of these ended in a traceback with exit status 1 before.
"""

import importlib.util
import os.path as osp
import subprocess
import sys

import pytest

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CONFIG = osp.join(REPO, 'configs', 'tiny', 'retinanet_r18_fpn_tiny-coco.py')
README = osp.join(REPO, 'README.md')


def _tool(name):
    spec = importlib.util.spec_from_file_location(
        f'tool_{name}', osp.join(REPO, 'tools', f'{name}.py')
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope='module')
def tools():
    return {
        name: _tool(name)
        for name in ('doctor', 'check_loss', 'check_dataset', 'replay')
    }


@pytest.fixture
def notes(tmp_path):
    path = tmp_path / 'notes.txt'
    path.write_text('not a config\n')
    return str(path)


def _run(tool, argv):
    """``tool.main(argv)``'s exit status, argparse's exits included."""
    try:
        return tool.main(argv)
    except SystemExit as done:
        return done.code


def _one_paragraph(capsys):
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert 'Traceback' not in captured.err + captured.out
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize(
    'name, argv, named',
    [
        ('doctor', [README], ["'", 'README.md', 'not a config file', '.py']),
        ('check_loss', ['NOTES'], ['notes.txt', 'not a config file']),
        ('check_dataset', ['NOTES'], ['notes.txt', 'not a config file']),
        (
            'check_loss',
            [CONFIG, '--kwargs', 'x'],
            ["--kwargs 'x' is invalid", 'expected KEY=VALUE'],
        ),
        (
            'check_loss',
            ['--loss', 'FocalLoss', '--kwargs', 'gamma=['],
            ["'gamma=['", 'brackets', 'do not balance', '[1,2]'],
        ),
        (
            'check_loss',
            ['--loss', 'FocalLoss', '--kwargs', 'gamma=abc'],
            ["'FocalLoss'", "{'gamma': 'abc'}", 'TypeError'],
        ),
        (
            'doctor',
            [CONFIG, '--cfg-options', 'model'],
            ["--cfg-options 'model' is invalid", 'KEY=VALUE'],
        ),
        (
            'check_dataset',
            [CONFIG, '--cfg-options', 'a=(1,'],
            ["'a=(1,'", 'do not balance'],
        ),
        (
            'replay',
            [README, '--config', CONFIG],
            ['README.md is not an incident folder', 'incident_000_iter'],
        ),
    ],
)
def test_bad_input_exits_2_in_one_paragraph(
    tools, notes, capsys, name, argv, named
):
    argv = [notes if a == 'NOTES' else a for a in argv]
    assert _run(tools[name], argv) == 2
    err = _one_paragraph(capsys)
    for text in named:
        assert text in err, err


def test_replay_names_a_config_that_is_not_one(tools, notes, tmp_path, capsys):
    from mmnanguard.engine.incident import IncidentRecorder

    folder = IncidentRecorder(str(tmp_path), 5, 0, 1).record(
        dict(iteration=1, kind='nonfinite_loss'),
        dict(data_batch={}, rng_state={}, iteration=1),
    )
    assert _run(tools['replay'], [folder, '--config', notes]) == 2
    err = _one_paragraph(capsys)
    assert notes in err and 'not a config file' in err


def test_command_line_has_no_traceback(notes):
    """The same, as a user runs it."""
    done = subprocess.run(
        [sys.executable, osp.join(REPO, 'tools', 'check_loss.py'), notes],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.returncode == 2
    assert 'Traceback' not in done.stderr
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith('tools/check_loss.py: ')
    )
