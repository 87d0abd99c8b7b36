# Copyright (c) mmnanguard contributors. All rights reserved.
"""mmrotate and mmseg stay optional (``mmnanguard.optional``).

The default stack has both, so every rotated module must be the real class
here. Their absence is tested twice: in a subprocess of this venv whose
import system refuses mmrotate and mmseg (below), and for real by
``tools/setup/check_wheel.sh`` in the core venv, which has neither.
"""

import subprocess
import sys
import textwrap

import pytest
from mmengine.config import Config
from mmengine.registry import MODELS, TASK_UTILS, Registry
from stack_marks import needs_mmrotate

import mmnanguard  # noqa: F401
from mmnanguard import optional
from mmnanguard.models import losses
from mmnanguard.models.task_modules import coders
from mmnanguard.optional import INSTALL

pytestmark = pytest.mark.stack_smoke

ROTATED = [(MODELS, n) for n in losses.ROTATED] + [
    (TASK_UTILS, n) for n in coders.ROTATED
]


@pytest.fixture
def missing(monkeypatch):
    """Make ``package`` count as not installed for :mod:`optional`."""

    def _missing(package):
        monkeypatch.setitem(optional._STATUS, package, 'it is not installed')

    return _missing


@needs_mmrotate
@pytest.mark.parametrize('registry,name', ROTATED)
def test_default_stack_registers_the_real_rotated_modules(registry, name):
    from mmrotate.registry import MODELS as ROTATE_MODELS
    from mmrotate.registry import TASK_UTILS as ROTATE_TASK_UTILS

    assert optional.unavailable_reason('mmrotate') is None
    assert optional.unavailable_reason('mmseg') is None
    cls = registry.get(name)
    assert isinstance(cls, type) and cls.__name__ == name
    assert cls.__module__.startswith('mmnanguard.models.')
    scoped = ROTATE_MODELS if registry is MODELS else ROTATE_TASK_UTILS
    assert scoped.get(name) is cls  # what an mmrotate config finds
    assert getattr(mmnanguard.models, name) is cls


def test_placeholder_build_raises_the_clear_error(missing):
    missing('mmrotate')
    root = Registry('model')
    child = Registry('model', parent=root, scope='mmnanguard_test')
    optional.register_unavailable(child, ['SafeThing'], 'mmrotate')
    expected = (
        "type='SafeThing' needs mmrotate, but it is not installed. Install "
        f'it with {INSTALL["mmrotate"]} or '
        'remove it from the config.'
    )
    for registry in (child, root):
        with pytest.raises(optional.MissingPackageError) as info:
            registry.build(dict(type='SafeThing', loss_weight=1.0))
        assert str(info.value) == expected
        assert info.value.name == 'mmrotate'
        assert isinstance(info.value, ModuleNotFoundError)


def test_missing_attribute_names_the_module(missing):
    missing('mmseg')
    getter = optional.missing_attribute('pkg.mod', ['Seg'], 'mmseg')
    with pytest.raises(optional.MissingPackageError) as info:
        getter('Seg')
    assert str(info.value) == (
        'pkg.mod.Seg needs mmseg, but it is not installed. Install it with '
        f'{INSTALL["mmseg"]}.'
    )
    with pytest.raises(AttributeError, match="'pkg.mod' has no .* 'Other'"):
        getter('Other')


@pytest.mark.parametrize(
    'cfg,where',
    [
        (dict(default_scope='mmseg'), "default_scope='mmseg'"),
        (
            dict(model=dict(type='EncoderDecoder', _scope_='mmseg')),
            "cfg.model._scope_='mmseg'",
        ),
        (
            dict(model=dict(type='X', heads=[dict(type='mmseg.FCNHead')])),
            "cfg.model.heads[0].type='mmseg.FCNHead'",
        ),
    ],
)
def test_require_packages_names_key_package_and_file(missing, cfg, where):
    missing('mmseg')
    for config in (cfg, Config(cfg)):
        with pytest.raises(optional.MissingPackageError) as info:
            optional.require_packages(config, 'my_cfg.py')
        assert str(info.value) == (
            f'my_cfg.py: {where} needs mmseg, but it is not installed. '
            f'Install it with {INSTALL["mmseg"]} or remove it from the config.'
        )


@needs_mmrotate
def test_require_packages_accepts_what_is_installed(missing):
    missing('mmseg')
    cfg = dict(
        default_scope='mmdet',
        model=dict(type='mmengine.X', _scope_='mmrotate'),
        optim_wrapper=dict(type='mmnanguard.CPUAmpOptimWrapper'),
    )
    assert optional.require_packages(cfg) is None
    assert optional.require_packages(Config(cfg), 'cfg.py') is None


def test_unknown_optional_package_is_refused():
    with pytest.raises(
        ValueError,
        match=r"\['mmaction', 'mmocr', 'mmpose', 'mmpretrain', 'mmrotate', "
        r"'mmseg', 'mmyolo'\]"
        r".*'mmdet'",
    ):
        optional.unavailable_reason('mmdet')


HIDDEN = textwrap.dedent(
    """
    import importlib.abc, sys

    class Refuse(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split('.')[0] in ('mmrotate', 'mmseg'):
                raise ModuleNotFoundError(f'No module named {name!r}',
                                          name=name)
            return None

    sys.meta_path.insert(0, Refuse())
    import mmnanguard
    from mmengine.registry import MODELS, TASK_UTILS
    from mmnanguard.optional import MissingPackageError, unavailable_reason
    print('reason', unavailable_reason('mmrotate'), '|',
          unavailable_reason('mmseg'))
    print('loaded', sorted(m for m in sys.modules
                           if m.split('.')[0] in ('mmrotate', 'mmseg')))
    print('focal', MODELS.get('StableFocalLoss').__name__)
    for registry, name in [(MODELS, 'SafeGDLoss'),
                           (MODELS, 'SafeRotatedIoULoss'),
                           (TASK_UTILS, 'SafeDeltaXYWHTRBBoxCoder'),
                           (TASK_UTILS, 'SinCosAngleCoder')]:
        try:
            registry.build(dict(type=name))
        except MissingPackageError as err:
            print('build', name, err.name)
    try:
        from mmnanguard.models import SafeDeltaXYWHTRBBoxCoder
    except MissingPackageError as err:
        print('attr', err)
    """
)


def test_import_with_mmrotate_and_mmseg_refused():
    proc = subprocess.run(
        [sys.executable, '-c', HIDDEN],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert 'reason it is not installed | it is not installed' in lines
    assert 'loaded []' in lines
    assert 'focal StableFocalLoss' in lines
    for name in losses.ROTATED + coders.ROTATED:
        assert f'build {name} mmrotate' in lines
    assert (
        'attr mmnanguard.models.task_modules.coders.SafeDeltaXYWHTRBBoxCoder '
        'needs mmrotate, but it is not installed. Install it with pip '
        f'install {INSTALL["mmrotate"][len("pip install "):]}.'
    ) in lines


def test_dataset_scan_refuses_a_missing_scope(missing, tmp_path):
    from mmnanguard.datasets.scan import build_scan_dataset

    missing('mmseg')
    path = tmp_path / 'seg_cfg.py'
    path.write_text(
        "default_scope = 'mmseg'\n"
        "train_dataloader = dict(dataset=dict(type='CityscapesDataset'))\n"
    )
    cfg = Config.fromfile(str(path))
    with pytest.raises(optional.MissingPackageError) as info:
        build_scan_dataset(cfg, 'train')
    assert str(info.value).startswith(
        f"{path}: default_scope='mmseg' needs mmseg, but it is not installed"
    )


@pytest.mark.parametrize(
    'error,reason',
    [
        (
            ModuleNotFoundError("No module named 'mmseg'", name='mmseg'),
            'it is not installed',
        ),
        (
            ModuleNotFoundError("No module named 'ftfy'", name='ftfy'),
            "it fails to import: No module named 'ftfy'",
        ),
        (
            AssertionError('MMCV==2.2.0 is used but incompatible'),
            "it fails to import: AssertionError('MMCV==2.2.0 is used but "
            "incompatible')",
        ),
    ],
)
def test_reason_tells_missing_from_broken(monkeypatch, error, reason):
    def refuse(name):
        raise error

    monkeypatch.delitem(optional._STATUS, 'mmseg', raising=False)
    monkeypatch.setattr(optional, 'import_module', refuse)
    if reason == 'it is not installed':
        assert optional.unavailable_reason('mmseg') == reason
    else:  # installed but broken: said once, not only when a config uses it
        with pytest.warns(UserWarning) as seen:
            assert optional.unavailable_reason('mmseg') == reason
        assert [str(w.message) for w in seen] == [
            f'nanguard: mmseg is installed, but {reason}; the mmnanguard '
            'modules that need it are not registered'
        ]
    assert not optional.is_available('mmseg')
    assert optional.missing_message('X', 'mmseg', False) == (
        f'X needs mmseg, but {reason}. Install it with {INSTALL["mmseg"]}.'
    )
