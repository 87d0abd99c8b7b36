# Copyright (c) mmnanguard contributors. All rights reserved.
"""``FaultInjectionHook`` is a test and drill helper, not part of the
product: ``import mmnanguard`` (and every lookup that makes mmengine import
the registries' ``locations``) leaves it out of mmnanguard's and MMEngine's
``HOOKS``; importing ``mmnanguard.testing``, directly or through a config's
``custom_imports``, registers it in both.

Each case runs in a fresh interpreter: this test session has imported
``mmnanguard.testing`` long before.
"""

import json
import subprocess
import sys

import pytest

#: Where the hook lives, as the registries must return it.
HOOK_CLASS = 'mmnanguard.testing.fault_injection_hook.FaultInjectionHook'

#: Each lookup of ``PROBE``: how a config or code reaches the hook.
LOOKUPS = (
    'get:mmnanguard.HOOKS',
    'get:mmnanguard.HOOKS scoped',
    'get:mmengine.HOOKS',
    'get:mmengine.HOOKS scoped',
    'build:scope mmnanguard',
    'build:scope mmengine',
    'build:scope mmdet',
    'build:scope mmdet, scoped',
)

#: ``python -c PROBE WAY CONFIG``: look the hook up after
#: ``import mmnanguard``, then register it the way ``WAY`` says
#: (``import``: ``import mmnanguard.testing``; ``custom_imports``: load
#: ``CONFIG``, whose ``custom_imports`` names it) and look it up again.
#: Prints one JSON object: ``before`` and ``after`` (lookup -> the class's
#: dotted path, or ``None`` / ``'KeyError'``), the built hook's
#: ``fault`` and ``iteration``, and which testing modules were imported
#: before the registration.
PROBE = r"""
import json
import sys

import mmnanguard  # noqa: F401
from mmengine.registry import HOOKS as ROOT_HOOKS
from mmengine.registry import DefaultScope

from mmnanguard.registry import HOOKS

CFG = dict(type='FaultInjectionHook', fault='inf_loss', iteration=3)
TESTING = ('mmnanguard.testing', 'mmnanguard.testing.fault_injection_hook')


def path(cls):
    return None if cls is None else f'{cls.__module__}.{cls.__qualname__}'


def build(scope, scoped=False):
    cfg = dict(CFG)
    if scoped:
        cfg['type'] = 'mmnanguard.' + cfg['type']
    with DefaultScope.overwrite_default_scope(scope):
        try:
            hook = ROOT_HOOKS.build(cfg)
        except KeyError:
            return 'KeyError', None
    return path(type(hook)), [hook.fault, hook.iteration]


def lookups():
    seen = {
        'get:mmnanguard.HOOKS': path(HOOKS.get('FaultInjectionHook')),
        'get:mmnanguard.HOOKS scoped': path(
            HOOKS.get('mmnanguard.FaultInjectionHook')
        ),
        'get:mmengine.HOOKS': path(ROOT_HOOKS.get('FaultInjectionHook')),
        'get:mmengine.HOOKS scoped': path(
            ROOT_HOOKS.get('mmnanguard.FaultInjectionHook')
        ),
    }
    built = {}
    for scope in ('mmnanguard', 'mmengine', 'mmdet'):
        seen[f'build:scope {scope}'], built[scope] = build(scope)
    seen['build:scope mmdet, scoped'], _ = build('mmdet', scoped=True)
    return seen, built


before, _ = lookups()
imported_before = [name for name in TESTING if name in sys.modules]
way, config = sys.argv[1], sys.argv[2]
if way == 'import':
    import mmnanguard.testing  # noqa: F401
else:
    from mmengine.config import Config

    Config.fromfile(config)
after, built = lookups()
print(json.dumps(dict(
    before=before,
    after=after,
    built=built,
    imported_before=imported_before,
)))
"""


def _probe(way: str, config: str) -> dict:
    proc = subprocess.run(
        [sys.executable, '-c', PROBE, way, config],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize('way', ['import', 'custom_imports'])
def test_registered_only_by_mmnanguard_testing(way, tmp_path):
    config = tmp_path / 'drill.py'
    config.write_text(
        "custom_imports = dict(imports=['mmnanguard.testing'],"
        ' allow_failed_imports=False)\n'
        "custom_hooks = [dict(type='FaultInjectionHook', fault='inf_loss',"
        ' iteration=3)]\n'
    )
    seen = _probe(way, str(config))
    # import mmnanguard, the registries' locations and the default scopes
    # of mmnanguard, mmengine and mmdet import nothing of mmnanguard.testing
    assert seen['imported_before'] == []
    assert seen['before'] == {
        key: (None if key.startswith('get:') else 'KeyError')
        for key in LOOKUPS
    }
    # registered under its bare name in both registries, so that a config
    # of every scope (mmdet, mmrotate, mmseg) builds it
    assert seen['after'] == {key: HOOK_CLASS for key in LOOKUPS}
    assert seen['built'] == {
        scope: ['inf_loss', 3] for scope in ('mmnanguard', 'mmengine', 'mmdet')
    }


def test_not_exported_by_the_product_hooks():
    from mmnanguard.engine import hooks
    from mmnanguard.testing import FaultInjectionHook

    assert 'FaultInjectionHook' not in hooks.__all__
    assert not hasattr(hooks, 'FaultInjectionHook')
    assert (
        f'{FaultInjectionHook.__module__}.{FaultInjectionHook.__qualname__}'
        == HOOK_CLASS
    )
