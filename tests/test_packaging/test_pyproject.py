# Copyright (c) mmnanguard contributors. All rights reserved.
"""``pyproject.toml`` declares what the package modules define: the
extras of :func:`mmnanguard.supported_stacks.extras_require`, the console
scripts of :data:`mmnanguard.cli.COMMANDS` and the version of
``mmnanguard/version.py``. The built wheel's files are checked by
``tools/setup/check_wheel.sh``."""

import os.path as osp
import re

import pytest

from mmnanguard import cli, supported_stacks
from mmnanguard.version import __version__

tomllib = pytest.importorskip('tomllib')

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


@pytest.fixture(scope='module')
def pyproject():
    with open(osp.join(REPO, 'pyproject.toml'), 'rb') as f:
        return tomllib.load(f)


def test_extras_are_the_tested_ranges(pyproject):
    declared = pyproject['project']['optional-dependencies']
    assert declared == supported_stacks.extras_require()


def test_console_scripts_are_the_cli_commands(pyproject):
    scripts = pyproject['project']['scripts']
    assert [f'{k} = {v}' for k, v in scripts.items()] == cli.CONSOLE_SCRIPTS
    for target in scripts.values():
        module, name = target.split(':')
        assert module == 'mmnanguard.cli' and callable(getattr(cli, name))


def test_version_comes_from_version_py(pyproject):
    assert pyproject['project']['dynamic'] == ['version']
    attr = pyproject['tool']['setuptools']['dynamic']['version']['attr']
    assert attr == 'mmnanguard.version.__version__'
    assert re.fullmatch(r'\d+\.\d+\.\d+(rc\d+)?', __version__)


def test_package_data_is_what_setup_py_links(pyproject):
    data = pyproject['tool']['setuptools']['package-data']['mmnanguard']
    # setup.py puts configs/, tools/ and model-index.yml under .mim
    assert sorted(p.split('/')[1] for p in data) == [
        'configs',
        'model-index.yml',
        'tools',
    ]
    for name in ('configs', 'tools', 'model-index.yml'):
        assert osp.exists(osp.join(REPO, name))


def test_tool_settings_live_in_pyproject_only(pyproject):
    assert pyproject['tool']['ruff']['line-length'] == 79
    assert 'ini_options' in pyproject['tool']['pytest']
    for name in ('pytest.ini', 'ruff.toml', 'setup.cfg', 'tox.ini'):
        assert not osp.exists(osp.join(REPO, name)), name
