# Copyright (c) mmnanguard contributors. All rights reserved.
"""docs/usage.md's settings tables are true to the code.

The "Settings" section of docs/usage.md has two tables: the guard's
settings (the fields of :class:`GuardSettings`, with each nested settings
class's fields as ``spike.action`` rows) and the runner's keys
(:data:`RUNNER_KEYS`, fields of :class:`ProtectionSettings`). Every
setting of the classes has a row and every row is a setting; each row's
*default* is the class default and its *the include* cell is the value
``configs/_base_/nanguard_settings.py`` sets where it differs (empty where
the include leaves the default). The names and defaults are read from the
classes, never listed here, so a field added to a class without a row
fails :func:`test_every_setting_has_a_row`.
"""

import ast
import dataclasses
import os.path as osp
import re
import typing
from typing import Any, Dict, List, Tuple

import pytest
from mmengine.config import Config

from mmnanguard.engine.guard import GuardSettings, SpikeSettings
from mmnanguard.engine.runner import ProtectionSettings
from mmnanguard.engine.runner.protection import RUNNER_KEYS

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
USAGE = osp.join(REPO, 'docs', 'usage.md')
INCLUDE_FILE = osp.join(REPO, 'configs', '_base_', 'nanguard_settings.py')

SECTION = '## Settings'
GUARD_TABLE = "### The guard's settings"
RUNNER_TABLE = "### The runner's keys"
COLUMNS = ['setting', 'default', 'the include', 'what it does']

#: A table row: the setting's name, its default and the include's value
#: (each a Python expression in backticks, or '' for an empty cell).
Row = Tuple[str, str, str]


# -- reading docs/usage.md ---------------------------------------------------
def _section(text: str, heading: str) -> str:
    """The text under ``heading`` up to the next heading of its level or
    above."""
    level = heading.split(' ')[0]
    match = re.search(rf'^{re.escape(heading)}\s*$', text, re.M)
    assert match, f'docs/usage.md has no {heading!r} heading'
    end = re.compile(rf'^#{{1,{len(level)}}} ', re.M)
    stop = end.search(text, match.end())
    return text[match.end() : stop.start() if stop else len(text)]


def _cells(line: str) -> List[str]:
    return [c.strip() for c in line.strip().strip('|').split('|')]


def _code(cell: str) -> str:
    """The one code span a cell holds (its whole content), or ''."""
    if not cell:
        return ''
    match = re.fullmatch(r'`([^`]+)`', cell)
    assert match, f'expected one `...` value, got {cell!r}'
    return match.group(1)


def _table(heading: str) -> Dict[str, Row]:
    """The rows of the table under ``heading`` of the Settings section,
    by setting name."""
    with open(USAGE, encoding='utf-8') as f:
        section = _section(f.read(), SECTION)
    lines = [
        line
        for line in _section(section, heading).splitlines()
        if line.startswith('|')
    ]
    assert len(lines) > 2, f'no table under {heading!r}'
    assert _cells(lines[0]) == COLUMNS
    assert set(_cells(lines[1])) == {'---'}
    rows: Dict[str, Row] = {}
    for line in lines[2:]:
        cells = _cells(line)
        assert len(cells) == len(COLUMNS), f'a row of 4 cells: {line!r}'
        name, default, include = (_code(c) for c in cells[:3])
        assert name not in rows, f'{name!r} has two rows'
        assert cells[3], f'{name!r} says nothing about what it does'
        rows[name] = (name, default, include)
    return rows


def _value(expr: str) -> Any:
    """A documented value: a literal, ``dict(key=literal, ...)`` or a list
    of them (evaluated without ``eval``)."""

    def convert(node: ast.AST) -> Any:
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == 'dict'
            and not node.args
        ):
            return {k.arg: convert(k.value) for k in node.keywords}
        if isinstance(node, ast.List):
            return [convert(e) for e in node.elts]
        return ast.literal_eval(node)

    return convert(ast.parse(expr, mode='eval').body)


# -- reading the code --------------------------------------------------------
def _nested(cls: type) -> Dict[str, type]:
    """Fields of ``cls`` that take a settings dataclass of their own
    (``spike`` -> :class:`SpikeSettings`), from the type annotations."""
    nested = {}
    for name, hint in typing.get_type_hints(cls).items():
        for arg in typing.get_args(hint) or (hint,):
            if dataclasses.is_dataclass(arg):
                nested[name] = arg
    return nested


def _settings(cls: type, instance: Any) -> Dict[str, Any]:
    """Every setting of ``cls`` with its default as ``instance`` holds it,
    nested settings as ``field.subfield``."""
    values = {
        f.name: getattr(instance, f.name) for f in dataclasses.fields(cls)
    }
    for name, sub in _nested(cls).items():
        defaults = sub()
        for f in dataclasses.fields(sub):
            values[f'{name}.{f.name}'] = getattr(defaults, f.name)
    return values


def guard_settings() -> Dict[str, Any]:
    return _settings(GuardSettings, GuardSettings())


def runner_settings() -> Dict[str, Any]:
    """The runner's keys with the defaults a ``nanguard`` dict without
    them is parsed to."""
    fields = {f.name for f in dataclasses.fields(ProtectionSettings)}
    assert set(RUNNER_KEYS) <= fields
    parsed = ProtectionSettings.from_dict({})
    return {key: getattr(parsed, key) for key in RUNNER_KEYS}


def _include() -> Dict[str, Any]:
    """The include's values, ``spike``'s fields as ``spike.x``."""
    values = dict(Config.fromfile(INCLUDE_FILE).to_dict()['nanguard'])
    for name in _nested(GuardSettings):
        for key, value in (values.get(name) or {}).items():
            values[f'{name}.{key}'] = value
    return values


def _undocumented(settings: Dict[str, Any], rows: Dict[str, Row]) -> set:
    return set(settings) - set(rows)


TABLES = {
    GUARD_TABLE: guard_settings,
    RUNNER_TABLE: runner_settings,
}


# -- the checks ---------------------------------------------------------------
def test_the_nested_settings_are_found():
    assert _nested(GuardSettings) == {'spike': SpikeSettings}
    assert 'spike.action' in guard_settings()


@pytest.mark.parametrize('heading', sorted(TABLES))
def test_every_setting_has_a_row(heading):
    missing = _undocumented(TABLES[heading](), _table(heading))
    assert not missing, f'docs/usage.md ({heading}) omits {sorted(missing)}'


@pytest.mark.parametrize('heading', sorted(TABLES))
def test_every_row_is_a_setting(heading):
    unknown = set(_table(heading)) - set(TABLES[heading]())
    assert not unknown, f'docs/usage.md ({heading}) names {sorted(unknown)}'


@pytest.mark.parametrize('heading', sorted(TABLES))
def test_each_default_is_the_class_default(heading):
    settings = TABLES[heading]()
    for name, default, _ in _table(heading).values():
        assert default, f'{name!r} has no default in docs/usage.md'
        documented, actual = _value(default), settings[name]
        assert documented == actual and type(documented) is type(actual), (
            f'docs/usage.md: {name} defaults to {default}; the code '
            f'says {actual!r}'
        )


@pytest.mark.parametrize('heading', sorted(TABLES))
def test_the_include_column_is_what_the_include_sets(heading):
    settings, include = TABLES[heading](), _include()
    for name, _, documented in _table(heading).values():
        differs = name in include and include[name] != settings[name]
        if not differs:
            assert not documented, (
                f'docs/usage.md: the include leaves {name} at its default, '
                f'not {documented}'
            )
            continue
        assert documented, (
            f'docs/usage.md: the include sets {name}={include[name]!r}; '
            'its "the include" cell is empty'
        )
        assert _value(documented) == include[name], (
            f'docs/usage.md: the include sets {name}={include[name]!r}, '
            f'not {documented}'
        )


def test_the_documented_values_are_accepted():
    # every name is a key the nanguard dict and the hook take, and every
    # documented default and include value is valid
    guard = {k: _value(v[1]) for k, v in _table(GUARD_TABLE).items()}
    runner = {k: _value(v[1]) for k, v in _table(RUNNER_TABLE).items()}
    top = {k: v for k, v in guard.items() if '.' not in k}
    top['spike'] = {
        k.split('.', 1)[1]: v for k, v in guard.items() if '.' in k
    }
    GuardSettings.from_dict(top)
    ProtectionSettings.from_dict(dict(top, **runner))
    includes = {
        name: _value(row[2])
        for table in TABLES
        for name, row in _table(table).items()
        if row[2]
    }
    ProtectionSettings.from_dict(includes)


def test_the_check_sees_an_undocumented_field():
    # what a field added to GuardSettings or SpikeSettings without a row
    # in docs/usage.md looks like to test_every_setting_has_a_row
    rows = _table(GUARD_TABLE)
    assert not _undocumented(guard_settings(), rows)
    grown = dataclasses.make_dataclass(
        'GrownSettings',
        [('new_knob', int, dataclasses.field(default=1))],
        bases=(GuardSettings,),
    )
    assert _undocumented(_settings(grown, grown()), rows) == {'new_knob'}
    grown_spike = dataclasses.make_dataclass(
        'GrownSpike',
        [('new_knob', int, dataclasses.field(default=1))],
        bases=(SpikeSettings,),
    )
    nested = dataclasses.make_dataclass(
        'NestedGrown',
        [('spike', typing.Optional[grown_spike], None)],
        bases=(GuardSettings,),
    )
    assert _undocumented(_settings(nested, nested()), rows) == {
        'spike.new_knob'
    }
