# Copyright (c) mmnanguard contributors. All rights reserved.
"""Build step of mmnanguard that ``pyproject.toml`` cannot express.

The metadata, extras, entry points and package data are declared in
``pyproject.toml``. This file only puts ``configs/``, ``tools/`` and
``model-index.yml`` under ``mmnanguard/.mim/`` before setuptools collects
the package data, the way OpenMMLab packages ship them, so that
``mmnanguard::_base_/nanguard.py`` resolves from any installed copy and the
console entry points of :mod:`mmnanguard.cli` find their scripts.
"""

import os
import os.path as osp
import shutil

from setuptools import setup

HERE = osp.dirname(osp.abspath(__file__))


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
    setup()
