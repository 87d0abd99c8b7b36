# Copyright (c) mmnanguard contributors. All rights reserved.
"""No module of ``mmnanguard/engine/`` reaches 400 lines: one concept per
file, small enough to read at once (docs/architecture.md)."""

from pathlib import Path

import pytest

import mmnanguard

ENGINE = Path(mmnanguard.__file__).parent / 'engine'
LIMIT = 400


def _engine_modules():
    return sorted(ENGINE.rglob('*.py'))


def _lines(path: Path) -> int:
    with open(path, encoding='utf-8') as f:
        return sum(1 for _ in f)


def test_the_engine_modules_are_found():
    modules = _engine_modules()
    assert len(modules) > 50
    assert ENGINE / 'guard' / 'step_guard.py' in modules


@pytest.mark.parametrize(
    'path',
    _engine_modules(),
    ids=lambda p: str(p.relative_to(ENGINE)),
)
def test_module_is_under_the_limit(path):
    lines = _lines(path)
    assert lines < LIMIT, (
        f'{path.relative_to(ENGINE.parent)} has {lines} lines (limit '
        f'{LIMIT}); split it by concept'
    )
