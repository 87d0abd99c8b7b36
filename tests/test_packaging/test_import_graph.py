# Copyright (c) mmnanguard contributors. All rights reserved.
"""mmnanguard's imports form no cycle, between modules or packages.

The graph is read from the source (every ``import`` and ``from ... import``
of a module, at any depth, resolved against the package), not from what
happens to be imported at run time, so a cycle hidden behind a function
level import counts too.
"""

import ast
import os
import os.path as osp
from typing import Dict, List, Set

import pytest

import mmnanguard

ROOT = osp.dirname(mmnanguard.__file__)


def _module_name(path: str) -> str:
    rel = osp.relpath(path, osp.dirname(ROOT))[: -len('.py')]
    parts = rel.split(os.sep)
    if parts[-1] == '__init__':
        parts = parts[:-1]
    return '.'.join(parts)


def _modules() -> Dict[str, str]:
    found = {}
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith('.')]
        for name in files:
            if name.endswith('.py'):
                path = osp.join(folder, name)
                found[_module_name(path)] = path
    return found


def _imports(name: str, path: str, modules: Dict[str, str]) -> Set[str]:
    with open(path, encoding='utf-8') as f:
        tree = ast.parse(f.read(), path)
    package = name if path.endswith('__init__.py') else name.rpartition('.')[0]
    targets: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                anchor = package.split('.')
                anchor = anchor[: len(anchor) - node.level + 1]
                base = '.'.join(anchor + ([base] if base else []))
            for alias in node.names:
                full = f'{base}.{alias.name}'
                targets.add(full if full in modules else base)
    return {t for t in targets if t in modules and t != name}


def _graph() -> Dict[str, Set[str]]:
    modules = _modules()
    return {n: _imports(n, p, modules) for n, p in modules.items()}


def _cycle(graph: Dict[str, Set[str]]) -> List[str]:
    """One cycle of ``graph`` (a list of nodes), or []."""
    state: Dict[str, int] = {}
    stack: List[str] = []

    def visit(node: str) -> List[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


def _packages(graph: Dict[str, Set[str]], depth: int) -> Dict[str, Set[str]]:
    """The graph between packages ``depth`` levels below mmnanguard (a
    package's ``__init__`` re-exports are left out: they import what is
    below them by definition)."""

    def pkg(name: str) -> str:
        return '.'.join(name.split('.')[: depth + 1])

    modules = _modules()
    out: Dict[str, Set[str]] = {}
    for name, targets in graph.items():
        if modules[name].endswith('__init__.py'):
            continue
        src = pkg(name)
        out.setdefault(src, set()).update(
            pkg(t) for t in targets if pkg(t) != src
        )
    return out


def test_the_graph_is_read():
    graph = _graph()
    assert 'mmnanguard.engine.guard.step_guard' in graph
    assert (
        'mmnanguard.engine.guard.verdict'
        in (graph['mmnanguard.engine.guard.step_guard'])
    )
    assert _cycle({'a': {'b'}, 'b': {'c'}, 'c': {'a'}}) == ['a', 'b', 'c', 'a']


def test_no_module_imports_itself_back():
    assert _cycle(_graph()) == []


@pytest.mark.parametrize('depth', [1, 2])
def test_no_cycle_between_packages(depth):
    # depth 1: mmnanguard.engine, .analysis, .datasets, .optional, ...;
    # depth 2: mmnanguard.engine.guard, .engine.diagnosis, ...
    assert _cycle(_packages(_graph(), depth)) == []


def test_the_incident_package_is_at_the_bottom():
    graph = _packages(_graph(), depth=2)
    below = graph['mmnanguard.engine.incident']
    assert (
        not {
            f'mmnanguard.engine.{p}'
            for p in ('guard', 'diagnosis', 'hooks', 'optimizers', 'runner')
        }
        & below
    )
