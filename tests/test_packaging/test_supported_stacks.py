# Copyright (c) mmnanguard contributors. All rights reserved.
"""The tested stacks (:mod:`mmnanguard.supported_stacks`): the running
stack lies inside them, the installed metadata carries them as extras, and
the check names what is wrong. Also run on every supported stack."""

import importlib.util
from importlib import metadata

import pytest
from packaging.requirements import Requirement

from mmnanguard import supported_stacks
from mmnanguard.supported_stacks import (
    TESTED,
    check_installed,
    extras_require,
    install_line,
    installed_distributions,
    version_problems,
)

pytestmark = pytest.mark.stack_smoke


def test_running_stack_is_a_tested_one():
    assert version_problems() == []
    for name in supported_stacks.REQUIRED:
        assert len(installed_distributions(name)) == 1, name


def test_installed_metadata_has_the_tested_extras():
    extras = extras_require()
    assert set(extras) == {
        'upstream',
        'onedl',
        'rotate',
        'seg',
        'onedl-rotate',
        'onedl-seg',
    }
    declared = {}
    for line in metadata.requires('mmnanguard') or []:
        req = Requirement(line)
        for extra in extras:
            if req.marker and req.marker.evaluate({'extra': extra}):
                declared.setdefault(extra, set()).add(
                    f'{req.name}{req.specifier}'
                )
    for extra, reqs in extras.items():
        expected = {str(Requirement(r)) for r in reqs}
        assert declared[extra] == expected, extra
    # the two families never share a distribution
    upstream = {Requirement(r).name for r in extras['upstream']}
    onedl = {Requirement(r).name for r in extras['onedl']}
    assert upstream == {'mmengine', 'mmcv', 'mmdet'}
    assert onedl == {'onedl-mmengine', 'onedl-mmcv', 'onedl-mmdetection'}


def _fake_versions(monkeypatch, versions):
    def version(dist):
        if dist in versions:
            return versions[dist]
        raise metadata.PackageNotFoundError(dist)

    monkeypatch.setattr(supported_stacks.metadata, 'version', version)


@pytest.mark.parametrize(
    'versions, expected',
    [
        (
            dict(mmengine='0.10.7', mmcv='2.1.0', mmdet='3.3.0'),
            [],
        ),
        (
            dict(mmengine='0.10.7', mmcv='2.2.0', mmdet='3.3.0'),
            ['mmcv 2.2.0 is outside the tested range >=2.0.1,<2.2'],
        ),
        (
            dict(mmengine='0.9.1', mmcv='2.0.1', mmdet='3.0.0'),
            [
                'mmengine 0.9.1 is outside the tested range >=0.10.7,<0.11',
                'mmdet 3.0.0 is outside the tested range >=3.1.0,<3.4',
            ],
        ),
        (
            {
                'onedl-mmengine': '0.10.12',
                'onedl-mmcv': '2.3.6',
                'onedl-mmdetection': '3.5.1',
                'onedl-mmrotate': '1.2.1',
                'mmrotate': '1.0.0rc1',
            },
            [
                'both mmrotate 1.0.0rc1 and onedl-mmrotate 1.2.1 are '
                'installed; they install the same `mmrotate` package over '
                'each other, so keep one'
            ],
        ),
        (
            dict(
                mmengine='0.10.7',
                mmcv='2.0.1',
                mmdet='3.1.0',
                mmrotate='1.0.0',
            ),
            ['mmrotate 1.0.0 is outside the tested range ==1.0.0rc1'],
        ),
    ],
)
def test_version_problems_name_distribution_version_and_range(
    monkeypatch, versions, expected
):
    _fake_versions(monkeypatch, versions)
    assert version_problems() == expected


def test_untested_version_warns_once_at_check(monkeypatch):
    _fake_versions(
        monkeypatch, dict(mmengine='0.10.7', mmcv='2.2.0', mmdet='3.3.0')
    )
    with pytest.warns(UserWarning, match=r'mmcv 2\.2\.0 is outside') as seen:
        check_installed()
    assert len(seen) == 1


def test_missing_required_package_is_a_clear_import_error(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        'find_spec',
        lambda name, *a: None if name == 'mmcv' else real(name, *a),
    )
    with pytest.raises(ImportError) as err:
        check_installed()
    message = str(err.value)
    assert err.value.name == 'mmcv'
    assert 'mmnanguard needs mmcv, which is not installed' in message
    assert 'pip install "mmnanguard[upstream]"' in message
    assert 'pip install "mmnanguard[onedl]"' in message


@pytest.mark.parametrize(
    'versions, name, expected',
    [
        (
            {'onedl-mmdetection': '3.5.1'},
            'mmrotate',
            'pip install "mmnanguard[onedl-rotate]" '
            '(onedl-mmrotate>=1.2.1,<1.3)',
        ),
        (
            {'mmdet': '3.3.0'},
            'mmseg',
            'pip install "mmnanguard[seg]" (mmsegmentation>=1.2.2,<1.3)',
        ),
        (
            {'mmdet': '3.3.0'},
            'mmrotate',
            'pip install "mmnanguard[rotate]" (mmrotate==1.0.0rc1), which '
            'asserts mmdet <= 3.1.0',
        ),
    ],
)
def test_install_line_follows_the_installed_family(
    monkeypatch, versions, name, expected
):
    _fake_versions(monkeypatch, versions)
    assert install_line(name).startswith(expected)


def test_every_import_name_has_both_families():
    for name, families in TESTED.items():
        assert set(families) == set(supported_stacks.FAMILIES), name


def test_toolboxes_are_checked_against_their_tested_range(monkeypatch):
    _fake_versions(
        monkeypatch,
        dict(
            mmengine='0.10.7',
            mmcv='2.0.1',
            mmdet='3.1.0',
            mmyolo='0.6.0',
            mmpretrain='1.3.0',
            mmpose='1.3.2',
            mmocr='1.1.0',
        ),
    )
    assert version_problems() == [
        'mmpretrain 1.3.0 is outside the tested range >=1.2.0,<1.3',
        'mmocr 1.1.0 is outside the tested range >=1.0.1,<1.1',
    ]
    assert install_line('mmyolo') == 'pip install "mmyolo>=0.6.0,<0.7"'
    assert '--no-deps' in install_line('mmpose')
    assert install_line('mmocr').startswith('pip install "mmocr>=1.0.1,<1.1"')
