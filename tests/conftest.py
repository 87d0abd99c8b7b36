# Copyright (c) mmnanguard contributors. All rights reserved.
"""Shared fixtures: generated tiny datasets and the tiny families' real
runs (``family_runs``, from ``tests/family_runs.py``), once per session.

On a stack without mmrotate or mmseg (``tools/setup/check_wheel.sh`` runs
the ``stack_smoke`` tests on every supported stack), a test module that
imports the missing package at its top (or one of mmnanguard's rotated
modules, without mmrotate) is not collected; the header of the
run names each such module. On the default stack nothing is left out.
"""

import ast
import os.path as osp
from typing import List

import pytest
from family_runs import family_runs  # noqa: F401  (session fixture)

import mmnanguard  # noqa: F401  (applies the stack mends first)
from mmnanguard.datagen import generate_coco, generate_dota
from mmnanguard.models import losses
from mmnanguard.models.task_modules import coders
from mmnanguard.optional import INSTALL, is_available

#: mmnanguard names that exist only with mmrotate.
NEED_MMROTATE = frozenset(
    losses.ROTATED + coders.ROTATED + ['safe_rotated_iou_loss']
)

#: test module path -> the optional package it needs and the stack lacks.
NOT_COLLECTED: List[str] = []


def _needed_packages(path: str) -> List[str]:
    """The optional packages that ``path`` needs at import: the ones it
    imports at its top, and mmrotate for mmnanguard's rotated modules."""
    with open(path, encoding='utf-8') as f:
        tree = ast.parse(f.read(), path)
    needed = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            roots = [alias.name.split('.')[0] for alias in node.names]
            needed += [root for root in roots if root in INSTALL]
        elif isinstance(node, ast.ImportFrom) and node.module:
            root = node.module.split('.')[0]
            if root in INSTALL:
                needed.append(root)
            elif root == 'mmnanguard' and any(
                alias.name in NEED_MMROTATE for alias in node.names
            ):
                needed.append('mmrotate')
    return needed


def pytest_ignore_collect(collection_path, config):
    """Leave out a test module whose optional package is missing."""
    path = str(collection_path)
    if not (path.endswith('.py') and osp.basename(path).startswith('test_')):
        return None
    missing = [n for n in _needed_packages(path) if not is_available(n)]
    if missing:
        NOT_COLLECTED.append(f'{osp.relpath(path)} (needs {missing[0]})')
        return True
    return None


def pytest_report_collectionfinish(config, start_path, items):
    """Name the test modules left out for a missing optional package."""
    if NOT_COLLECTED:
        return [
            f'not collected, the stack lacks the package: {len(NOT_COLLECTED)}'
            ' module(s)'
        ] + [f'  {line}' for line in NOT_COLLECTED]
    return []


def _drop_stale_visualizers() -> None:
    """Forget mmengine visualizers whose run folder is gone.

    Upstream configs name their visualizer ``'visualizer'``, and mmengine
    gives every later runner of the process the instance of that name,
    which writes into the first run's ``vis_data``. A passing test's
    ``tmp_path`` is removed when it ends (``tmp_path_retention_policy``),
    so the next run's config dump would fail there: each runner gets a
    visualizer of its own, as in a process of its own.
    """
    from mmengine.visualization import Visualizer

    classes = [Visualizer]
    while classes:
        cls = classes.pop()
        classes.extend(cls.__subclasses__())
        instances = getattr(cls, '_instance_dict', {})
        for name, visualizer in list(instances.items()):
            backends = getattr(visualizer, '_vis_backends', {}).values()
            save_dirs = [getattr(b, '_save_dir', None) for b in backends]
            if any(d and not osp.isdir(osp.dirname(d)) for d in save_dirs):
                del instances[name]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After each test's teardown (its ``tmp_path`` removed), drop the
    visualizers of removed run folders, before any fixture of the next
    test builds a runner."""
    yield
    _drop_stale_visualizers()


@pytest.fixture(scope='session')
def tiny_dota_root(tmp_path_factory):
    """A generated 8-image DOTA-format folder (``trainval/``)."""
    root = tmp_path_factory.mktemp('tiny_dota')
    generate_dota(str(root), num_images=8, seed=0)
    return str(root)


@pytest.fixture(scope='session')
def tiny_coco_root(tmp_path_factory):
    """A generated 8-image COCO-format folder with 3 classes."""
    root = tmp_path_factory.mktemp('tiny_coco')
    generate_coco(str(root), num_images=8, seed=0)
    return str(root)


@pytest.fixture(scope='session')
def tiny_cityscapes_root(tmp_path_factory):
    """A generated 4-image Cityscapes-format folder (``train``, 256x128,
    train ids 0..18 and 255 regions, no stray values)."""
    from mmnanguard.datagen import generate_cityscapes

    root = tmp_path_factory.mktemp('tiny_cityscapes')
    generate_cityscapes(str(root), num_images=4, seed=0)
    return str(root)


@pytest.fixture
def incident_writes(monkeypatch):
    """The names of the incident files written from now on, in order (every
    incident file goes through ``safe_write.write_at``)."""
    from mmnanguard.engine.incident import recorder, safe_write

    names = []
    original = safe_write.write_at

    def counting(dir_fd, name, data):
        names.append(name)
        original(dir_fd, name, data)

    monkeypatch.setattr(safe_write, 'write_at', counting)
    monkeypatch.setattr(recorder, 'write_at', counting)
    return names
