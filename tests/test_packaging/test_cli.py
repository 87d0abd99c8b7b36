# Copyright (c) mmnanguard contributors. All rights reserved.
"""Console entry points (``mmnanguard.cli``); ``pyproject.toml`` declares
them (tests/test_packaging/test_pyproject.py). The installed wheel's
commands are run by ``tools/setup/check_wheel.sh``."""

import os.path as osp
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
    # where DeepSpeed is installed, mmengine imports it, and its logger
    # says on stdout which accelerator it picked; nothing else comes first
    before, usage, _ = proc.stdout.partition('usage: train.py ')
    assert usage, proc.stdout[:2000]
    for line in before.splitlines():
        assert 'real_accelerator.py' in line, proc.stdout[:2000]
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
