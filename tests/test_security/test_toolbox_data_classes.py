# Copyright (c) mmnanguard contributors. All rights reserved.
"""An incident batch of a toolbox nobody named loads when its classes are
the data classes of an installed OpenMMLab toolbox, and nothing else does.

Two packages are installed into a folder on ``sys.path`` with real
distribution metadata: ``ocrbox`` declares mmengine (under the ``mim``
extra, as mmocr does) and defines a data sample with a ``LabelData``
field, as mmocr's ``TextRecogDataSample``; ``plainbox`` defines the same
class but does not require mmengine.
"""

import os
import os.path as osp
import sys

import pytest
import torch

from mmnanguard.engine.incident import (
    UntrustedIncidentError,
    check_batch_globals,
    load_batch,
)
from mmnanguard.engine.incident.toolbox_data_classes import (
    openmmlab_packages,
)

STRUCTURES = '''
from mmengine.structures import BaseDataElement, LabelData


class TextSample(BaseDataElement):
    """A data sample with a text label."""


class Dictionary:
    """Not a data class."""


def evil():
    raise AssertionError('never called')
'''


def _install(site, package, requires):
    folder = osp.join(site, package)
    dist = osp.join(site, f'{package}-1.0.dist-info')
    for path in (folder, dist):
        os.makedirs(path)
    open(osp.join(folder, '__init__.py'), 'w').close()
    with open(osp.join(folder, 'structures.py'), 'w') as f:
        f.write(STRUCTURES)
    metadata = f'Metadata-Version: 2.1\nName: {package}\nVersion: 1.0\n'
    metadata += ''.join(f'Requires-Dist: {r}\n' for r in requires)
    with open(osp.join(dist, 'METADATA'), 'w') as f:
        f.write(metadata)
    with open(osp.join(dist, 'top_level.txt'), 'w') as f:
        f.write(f'{package}\n')


@pytest.fixture
def toolboxes(tmp_path, monkeypatch):
    site = str(tmp_path / 'site')
    _install(site, 'ocrbox', ['numpy', 'mmengine>=0.7.1; extra == "mim"'])
    _install(site, 'plainbox', ['numpy'])
    monkeypatch.syspath_prepend(site)
    yield
    for name in list(sys.modules):
        if name.split('.')[0] in ('ocrbox', 'plainbox'):
            del sys.modules[name]


def _batch(tmp_path, package, extra=None):
    import importlib

    from mmengine.structures import LabelData

    structures = importlib.import_module(f'{package}.structures')
    sample = structures.TextSample(
        metainfo=dict(img_path='word_1.png'),
        gt_text=LabelData(item='hello'),
    )
    data_samples = [sample] + ([] if extra is None else [extra(structures)])
    path = str(tmp_path / f'{package}_batch.pth')
    torch.save(
        dict(
            data_batch=dict(
                inputs=[torch.zeros(3, 8, 32)], data_samples=data_samples
            ),
            rng_state=None,
            iteration=3,
        ),
        path,
    )
    return path


def test_toolbox_packages_are_found_by_their_requirements(toolboxes):
    found = openmmlab_packages()
    assert 'ocrbox' in found and 'plainbox' not in found
    assert {'mmengine', 'mmdet'} <= found


def test_a_toolbox_data_sample_and_its_label_data_load(toolboxes, tmp_path):
    path = _batch(tmp_path, 'ocrbox')
    assert check_batch_globals(path) == []
    batch = load_batch(path)
    sample = batch['data_batch']['data_samples'][0]
    assert type(sample).__module__ == 'ocrbox.structures'
    assert sample.gt_text.item == 'hello'
    assert sample.img_path == 'word_1.png'
    assert batch['iteration'] == 3


def test_the_same_class_outside_a_toolbox_is_refused(toolboxes, tmp_path):
    path = _batch(tmp_path, 'plainbox')
    with pytest.raises(UntrustedIncidentError) as err:
        load_batch(path)
    assert path in str(err.value)
    assert 'plainbox.structures.TextSample' in str(err.value)


@pytest.mark.parametrize(
    'extra, name',
    [
        (lambda m: m.Dictionary, 'ocrbox.structures.Dictionary'),
        (lambda m: m.evil, 'ocrbox.structures.evil'),
        (lambda m: os.system, 'posix.system'),
    ],
    ids=['class_not_data', 'function', 'os_system'],
)
def test_anything_else_in_a_toolbox_batch_is_refused(
    toolboxes, tmp_path, extra, name
):
    path = _batch(tmp_path, 'ocrbox', extra)
    with pytest.raises(UntrustedIncidentError) as err:
        check_batch_globals(path)
    assert name in str(err.value) and path in str(err.value)
    with pytest.raises(UntrustedIncidentError):
        load_batch(path)
