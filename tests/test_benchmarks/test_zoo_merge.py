# Copyright (c) mmnanguard contributors. All rights reserved.
"""``benchmarks/zoo.py sweep`` merges into its ``--out`` file.

A sweep done in parts (the families not done yet, some again after a
fix) ends as one JSON: a family run again replaces its cell where it was,
the other cells are kept, and ``meta.runs`` lists every run. The cells are
faked here (no training); ``benchmarks/zoo_sweep.json`` is checked to be
such a file, one cell per family.
"""

import json
import os.path as osp
import sys

import pytest

BENCHMARKS = osp.join(
    osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))), 'benchmarks'
)
sys.path.insert(0, BENCHMARKS)

import zoo  # noqa: E402

FAMILIES = {'mmdet': ['mmdet/a', 'mmdet/b', 'mmdet/c']}


@pytest.fixture
def fake_cells(monkeypatch):
    """Every family passes at once; ``calls`` counts each cell run."""
    calls = []

    def run_cell(config, cell_dir, data_dir, fault, *args, **kwargs):
        calls.append(config)
        return dict(config=config, status='pass', run=len(calls))

    monkeypatch.setattr(
        zoo, 'families', lambda p: {f: [f + '.py'] for f in FAMILIES[p]}
    )
    monkeypatch.setattr(
        zoo, 'representative', lambda family, configs, ok: (configs[0], '')
    )
    monkeypatch.setattr(zoo, 'run_cell_subprocess', run_cell)
    return calls


def _sweep(out, tmp_path, *argv):
    args = zoo.parse_args(
        ['sweep', '--packages', 'mmdet', '--out', str(out)]
        + ['--work-root', str(tmp_path / 'work'), *argv]
    )
    assert args.func(args) == 0
    with open(out) as f:
        return json.load(f)


def test_parts_merge_into_one_file(fake_cells, tmp_path):
    out = tmp_path / 'sweep.json'
    first = _sweep(out, tmp_path, '--families', 'mmdet/a', 'mmdet/b')
    assert [c['family'] for c in first['cells']] == ['mmdet/a', 'mmdet/b']
    # the rest: skip what the file has
    rest = _sweep(out, tmp_path, '--skip', str(out))
    assert [c['family'] for c in rest['cells']] == [
        'mmdet/a',
        'mmdet/b',
        'mmdet/c',
    ]
    assert fake_cells == ['mmdet/a.py', 'mmdet/b.py', 'mmdet/c.py']
    # one family again: its cell is replaced where it was
    again = _sweep(out, tmp_path, '--families', 'mmdet/a')
    cells = {c['family']: c['guard']['run'] for c in again['cells']}
    assert list(cells) == ['mmdet/a', 'mmdet/b', 'mmdet/c']
    assert cells == {'mmdet/a': 4, 'mmdet/b': 2, 'mmdet/c': 3}
    runs = again['meta']['runs']
    assert len(runs) == 3
    assert runs[-1]['args']['families'] == ['mmdet/a']
    # --fresh starts anew
    fresh = _sweep(out, tmp_path, '--families', 'mmdet/c', '--fresh')
    assert [c['family'] for c in fresh['cells']] == ['mmdet/c']
    assert len(fresh['meta']['runs']) == 1


def test_a_file_of_one_run_before_merging(tmp_path):
    # the JSON of a sweep written before runs were merged
    path = tmp_path / 'old.json'
    meta = dict(command='python benchmarks/zoo.py sweep', started='x')
    path.write_text(json.dumps(dict(meta=meta, cells=[dict(family='f')])))
    assert zoo.load_sweep(str(path)) == ([dict(family='f')], [meta])
    assert zoo.load_sweep(str(tmp_path / 'none.json')) == ([], [])


def test_the_committed_sweep_is_one_merged_file():
    cells, runs = zoo.load_sweep(osp.join(BENCHMARKS, 'zoo_sweep.json'))
    families = [c['family'] for c in cells]
    assert len(families) == len(set(families)) == 186
    assert len(runs) == 6
    assert all(run['command'].startswith('python ') for run in runs)
