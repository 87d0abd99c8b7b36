# Copyright (c) mmnanguard contributors. All rights reserved.
"""Install mmnanguard.

The configs under ``configs/`` and the scripts under ``tools/`` are shipped
as package data under ``mmnanguard/.mim/``, the way OpenMMLab packages ship
them, so that ``mmnanguard::_base_/nanguard.py`` resolves from any installed
copy; the scripts are the console entry points of :mod:`mmnanguard.cli`
(``mmnanguard-train``, ...).
"""

import os
import os.path as osp
import shutil

from setuptools import find_packages, setup

HERE = osp.dirname(osp.abspath(__file__))


def read_module(name: str) -> dict:
    """The globals of ``mmnanguard/NAME.py``, a module that imports only
    the standard library (the package itself is not importable here)."""
    scope: dict = {}
    with open(osp.join(HERE, 'mmnanguard', f'{name}.py')) as f:
        exec(compile(f.read(), f'{name}.py', 'exec'), scope)
    return scope


def get_version() -> str:
    """Read ``__version__`` from ``mmnanguard/version.py``."""
    return read_module('version')['__version__']


def add_mim_extension() -> None:
    """Link (editable install) or copy (wheel) configs, tools and
    ``model-index.yml`` (which mmengine reads to resolve
    ``mmnanguard::...``) into ``mmnanguard/.mim``, like mmdet's
    ``setup.py`` does."""
    mim_path = osp.join(HERE, 'mmnanguard', '.mim')
    os.makedirs(mim_path, exist_ok=True)
    for name in ('configs', 'tools', 'model-index.yml'):
        src = osp.join(HERE, name)
        dst = osp.join(mim_path, name)
        if osp.islink(dst) or osp.isfile(dst):
            os.remove(dst)
        elif osp.isdir(dst):
            shutil.rmtree(dst)
        try:
            os.symlink(osp.relpath(src, mim_path), dst)
        except OSError:
            if osp.isdir(src):
                shutil.copytree(src, dst)
            else:
                shutil.copyfile(src, dst)


if __name__ == '__main__':
    add_mim_extension()
    setup(
        name='mmnanguard',
        version=get_version(),
        description='Finite checks, incident reports and recovery for '
        'OpenMMLab 2.x training',
        long_description=open(osp.join(HERE, 'README.md')).read(),
        long_description_content_type='text/markdown',
        license='Apache License 2.0',
        packages=find_packages(exclude=('tests', 'tests.*', 'benchmarks')),
        include_package_data=True,
        package_data={
            'mmnanguard': [
                '.mim/configs/**/*.py',
                '.mim/tools/*.py',
                '.mim/model-index.yml',
            ]
        },
        python_requires='>=3.8',
        # The toolboxes come from either OpenMMLab or the OneDL fork (same
        # import names, other distributions), so they are extras, with the
        # tested ranges of mmnanguard/supported_stacks.py.
        install_requires=['numpy'],
        extras_require=read_module('supported_stacks')['extras_require'](),
        entry_points={
            'console_scripts': read_module('cli')['CONSOLE_SCRIPTS']
        },
        zip_safe=False,
    )
