# Copyright (c) mmnanguard contributors. All rights reserved.
"""Console entry points (``mmnanguard.cli``) and ``setup.py``'s list of
them. The installed wheel's commands are run by
``tools/setup/check_wheel.sh``."""

import os.path as osp
import shutil
import subprocess
import sys

import pytest

from mmnanguard import cli

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


@pytest.mark.parametrize('command,name', sorted(cli.COMMANDS.items()))
def test_each_command_runs_the_shipped_script(command, name):
    path = cli.tool_path(name)
    assert path.endswith(osp.join('mmnanguard', '.mim', 'tools', name + '.py'))
    # this checkout is installed editable: .mim/tools links to tools/
    assert osp.samefile(path, osp.join(REPO, 'tools', f'{name}.py'))
    assert f'{command} = mmnanguard.cli:{name}' in cli.CONSOLE_SCRIPTS
    assert getattr(cli, name).__name__ == name


def test_setup_py_registers_the_console_scripts(tmp_path):
    # a copy: running setup.py rewrites the mmnanguard/.mim links
    (tmp_path / 'mmnanguard').mkdir()
    for name in (
        'setup.py',
        'README.md',
        'mmnanguard/version.py',
        'mmnanguard/cli.py',
        'mmnanguard/supported_stacks.py',
    ):
        shutil.copyfile(osp.join(REPO, name), tmp_path / name)
    code = (
        'import runpy, setuptools\n'
        'seen = {}\n'
        'setuptools.setup = lambda **kw: seen.update(kw)\n'
        "runpy.run_path('setup.py', run_name='__main__')\n"
        "print(seen['entry_points']['console_scripts'])\n"
    )
    proc = subprocess.run(
        [sys.executable, '-c', code],
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == str(
        [
            'mmnanguard-train = mmnanguard.cli:train',
            'mmnanguard-check-dataset = mmnanguard.cli:check_dataset',
            'mmnanguard-replay = mmnanguard.cli:replay',
            'mmnanguard-check-loss = mmnanguard.cli:check_loss',
            'mmnanguard-doctor = mmnanguard.cli:doctor',
        ]
    )


def test_train_help_through_the_entry_point(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            '-c',
            'import sys; from mmnanguard.cli import '
            "train; sys.argv = ['mmnanguard-train', '--help']; "
            'sys.exit(train())',
        ],
        cwd=str(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith('usage: train.py ')
    assert '--guard {raise,skip,rollback,off}' in proc.stdout


def test_unknown_command_is_refused(capsys):
    assert cli.run_tool('mmnanguard-trian', []) == 2
    err = capsys.readouterr().err
    assert "unknown command 'mmnanguard-trian'" in err
    assert "'mmnanguard-train'" in err


def test_missing_script_is_reported(monkeypatch, capsys, tmp_path):
    gone = str(tmp_path / 'train.py')
    monkeypatch.setattr(cli, 'tool_path', lambda name: gone)
    assert cli.run_tool('mmnanguard-train', ['--help']) == 2
    err = capsys.readouterr().err
    assert f'mmnanguard-train: the script {gone} is not installed' in err
    assert 'reinstall mmnanguard' in err
