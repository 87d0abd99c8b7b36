# Copyright (c) mmnanguard contributors. All rights reserved.
"""One source of settings: the classes and the includes.

``configs/_base_/nanguard_settings.py`` documents what each key does for a
user; :class:`GuardSettings`, :class:`SpikeSettings` and
:class:`ProtectionSettings` are what a ``NanGuardHook`` added alone (or a
``nanguard`` key without the include) gets. Every key the include sets is
compared with the class default, so the two cannot drift apart. The variant
includes (``*_recover``, ``*_strict``, ``safe_modules``) may differ from
the base only in the keys their comments name. (docs/usage.md against
the classes: ``test_docs_settings.py``.)
"""

import dataclasses
import os.path as osp
from typing import Any, Dict

import pytest
from mmengine.config import Config

from mmnanguard.engine.guard import GuardSettings, SpikeSettings
from mmnanguard.engine.runner import ProtectionSettings
from mmnanguard.engine.runner.protection import RUNNER_KEYS

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
BASE = osp.join(REPO, 'configs', '_base_')

#: Keys whose class default is "off" and which the include switches on;
#: for each, the class default asserted here (so changing it shows) and
#: what of the include's value is checked against a class instead.
SWITCHED_ON = {
    # the include turns spike logging on; its fields are SpikeSettings'
    'spike': None,
    # more hooks and the annotation check exist only through the runner
    'hooks': [],
    'validate_annotations': None,
}

#: Keys a variant include changes, as its comments (or those of the
#: include that loads it) name them.
VARIANT_CHANGES = {
    # "every incident rolls back ... halves the learning rates; after
    # max_rollbacks it stops"
    'nanguard_recover_settings.py': {'policy'},
    # "the first non-finite value stops training ... a bad annotation
    # file stops it too"
    'nanguard_strict_settings.py': {'policy', 'validate_annotations'},
    # "the numerically safe drop-ins"
    'safe_modules_settings.py': {'module_swaps'},
}


def _load(name: str) -> Dict[str, Any]:
    return Config.fromfile(osp.join(BASE, name)).to_dict()['nanguard']


def _defaults(cls: type) -> Dict[str, Any]:
    """Each field's default, from the dataclass itself."""
    values = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            values[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            values[f.name] = f.default_factory()
    return values


def _class_defaults() -> Dict[str, Any]:
    """Every ``nanguard`` key's default, guard and runner keys together."""
    protection = _defaults(ProtectionSettings)
    merged = _defaults(GuardSettings)
    merged.update({key: protection[key] for key in RUNNER_KEYS})
    return merged


INCLUDE = _load('nanguard_settings.py')


@pytest.mark.parametrize('key', sorted(INCLUDE))
def test_include_key_agrees_with_class_default(key):
    defaults = _class_defaults()
    assert key in defaults, f'the include sets {key!r}, no class has it'
    if key in SWITCHED_ON:
        assert defaults[key] == SWITCHED_ON[key]
        return
    assert INCLUDE[key] == defaults[key], (
        f'nanguard_settings.py sets {key}={INCLUDE[key]!r}; the class '
        f'default is {defaults[key]!r}'
    )


@pytest.mark.parametrize('key', sorted(INCLUDE['spike']))
def test_include_spike_agrees_with_spike_settings(key):
    default = _defaults(SpikeSettings)[key]
    assert INCLUDE['spike'][key] == default, (
        f'nanguard_settings.py sets spike.{key}={INCLUDE["spike"][key]!r}; '
        f'SpikeSettings defaults to {default!r}'
    )


def test_the_divergences_once_found_are_gone():
    # the two defaults a user adding NanGuardHook alone got differently
    # from what the include's comments describe
    assert SpikeSettings().action == INCLUDE['spike']['action'] == 'log'
    assert ProtectionSettings().check_labels is INCLUDE['check_labels']
    assert ProtectionSettings.from_dict({}).check_labels is True


def test_the_include_is_valid_and_parses_to_its_values():
    parsed = ProtectionSettings.from_dict(INCLUDE)
    assert parsed.check_labels is INCLUDE['check_labels']
    assert parsed.validate_annotations == INCLUDE['validate_annotations']
    assert parsed.guard['spike'] == dict(
        _defaults(SpikeSettings), **INCLUDE['spike']
    )


@pytest.mark.parametrize('name', sorted(VARIANT_CHANGES))
def test_variant_differs_only_in_its_named_keys(name):
    variant = _load(name)
    # a key the base leaves out stands at its class default
    base = dict(_class_defaults(), **INCLUDE)
    assert set(variant) <= set(base)
    changed = {key for key in variant if variant[key] != base[key]}
    assert changed == VARIANT_CHANGES[name]
    ProtectionSettings.from_dict(variant)  # valid as a whole
