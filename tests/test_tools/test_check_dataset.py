# Copyright (c) mmnanguard contributors. All rights reserved.
"""tools/check_dataset.py on generated DOTA, Cityscapes and COCO folders:
every planted problem with its file and line, nothing else, exit codes."""

import importlib.util
import json
import os.path as osp
import subprocess
import sys
from collections import defaultdict

import pytest

from mmnanguard.datagen import (
    BROKEN_KINDS,
    generate_cityscapes,
    generate_coco,
    generate_dota,
)
from mmnanguard.testing import TINY_COCO_CONFIG, TINY_DOTA_CONFIG

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
TOOL = osp.join(REPO, 'tools', 'check_dataset.py')
TINY_CITYSCAPES_CONFIG = osp.join(
    REPO, 'configs', 'tiny', 'fcn_r18-d8_tiny-cityscapes.py'
)

#: What the loading-only scan must report for each planted DOTA line.
EXPECTED_KINDS = {
    'zero_width': {'qbox_area', 'rbox_size'},
    'collapsed_quad': {'qbox_area', 'rbox_size'},
    'nan_coordinate': {'qbox_finite', 'rbox_finite'},
    'unknown_class': {'unknown_class'},
    'negative_coordinate': {'negative_coord'},
    'angle_pi_2': {'rbox_angle'},
}


def load_tool():
    spec = importlib.util.spec_from_file_location('check_dataset', TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope='module')
def tool():
    return load_tool()


def run(tool, tmp_path, config, root, *extra):
    out = str(tmp_path / 'report.json')
    code = tool.main(
        [
            config,
            '--out',
            out,
            '--no-progress',
            *extra,
            '--cfg-options',
            f'train_dataloader.dataset.data_root={osp.join(root, "")}',
        ]
    )
    with open(out) as f:
        return code, json.load(f)


def by_location(problems, stage=None):
    found = defaultdict(set)
    for p in problems:
        if stage is None or p['stage'] == stage:
            found[(p['file'], p['line'])].add(p['kind'])
    return dict(found)


@pytest.fixture(scope='module')
def broken_dota(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('broken_dota'))
    return root, generate_dota(root, num_images=8, seed=0, broken=BROKEN_KINDS)


def test_dota_every_planted_problem_with_file_and_line(
    tool, broken_dota, tmp_path, capsys
):
    root, written = broken_dota
    code, report = run(tool, tmp_path, TINY_DOTA_CONFIG, root)
    assert code == 1
    expected = {
        (b['annfile'], b['line']): EXPECTED_KINDS[b['kind']]
        for b in written['broken']
    }
    assert by_location(report['problems']) == expected
    # upstream's own loader cannot read this folder at all
    assert report['upstream_load_error'] == "KeyError: 'flying-saucer'"
    assert report['num_samples'] == 8
    # every valid line was loaded: 8 images, all lines but the unknown one
    lines = sum(len(open(f).read().splitlines()) for f in written['annfiles'])
    assert report['num_instances'] == lines - 1
    text = capsys.readouterr().out
    for b in written['broken']:
        assert f"{b['annfile']} | {b['line']} " in text
    assert 'kind' in text and 'count' in text


def test_dota_augment_repeats_reports_after_augmentation(
    tool, broken_dota, tmp_path
):
    root, written = broken_dota
    code, report = run(
        tool, tmp_path, TINY_DOTA_CONFIG, root, '--augment-repeats', '2'
    )
    assert code == 1
    planted = {b['kind']: b['annfile'] for b in written['broken']}
    for stage in ('augment[0]', 'augment[1]'):
        assert by_location(report['problems'], stage) == {
            (planted['zero_width'], None): {'rbox_size'},
            (planted['collapsed_quad'], None): {'rbox_size'},
            (planted['nan_coordinate'], None): {'rbox_finite'},
            (planted['angle_pi_2'], None): {'rbox_angle'},
        }


def test_planting_leaves_the_other_lines_as_they_were(broken_dota, tmp_path):
    """``broken=`` only inserts lines: removing them gives the files that
    the same call without ``broken`` writes."""
    _, written = broken_dota
    plain = generate_dota(str(tmp_path / 'plain'), num_images=8, seed=0)
    assert plain['broken'] == []
    planted = {(b['annfile'], b['line']) for b in written['broken']}
    for ours, theirs in zip(written['annfiles'], plain['annfiles']):
        with open(ours) as f:
            lines = [
                line
                for n, line in enumerate(f.read().splitlines(), start=1)
                if (ours, n) not in planted
            ]
        with open(theirs) as f:
            assert lines == f.read().splitlines()
    for ours, theirs in zip(written['images'], plain['images']):
        with open(ours, 'rb') as a, open(theirs, 'rb') as b:
            assert a.read() == b.read()


def test_dota_clean_folder_exit_zero(tool, tiny_dota_root, tmp_path):
    code, report = run(tool, tmp_path, TINY_DOTA_CONFIG, tiny_dota_root)
    assert code == 0
    assert report['problems'] == []
    assert report['upstream_load_error'] == ''
    assert report['loading_transforms'] == [
        'LoadImageFromFile',
        'LoadAnnotations',
        'ConvertBoxType',
    ]


def test_cityscapes_stray_values_and_nothing_else(tool, tmp_path):
    root = str(tmp_path / 'cityscapes')
    written = generate_cityscapes(
        root, num_images=4, stray_values=(19, 34, 200)
    )
    code, report = run(tool, tmp_path, TINY_CITYSCAPES_CONFIG, root)
    assert code == 1
    expected = defaultdict(list)
    for s in written['stray']:
        expected[s['seg_map']].append(s)
    assert len(report['problems']) == len(expected) == 3
    for p in report['problems']:
        assert p['kind'] == 'seg_values' and p['line'] is None
        planted = expected[p['file']]
        assert p['values'] == sorted(s['value'] for s in planted)
        for s in planted:
            assert f"{s['value']}: {s['pixels']} px" in p['detail']


def test_cityscapes_clean_exit_zero(tool, tiny_cityscapes_root, tmp_path):
    code, report = run(
        tool,
        tmp_path,
        TINY_CITYSCAPES_CONFIG,
        tiny_cityscapes_root,
        '--augment-repeats',
        '1',
    )
    assert code == 0
    assert report['num_samples'] == 4 and report['problems'] == []


def coco_with_negative_box(root):
    """The tiny COCO set with a box of negative x (annotation 999, image
    2's last); returns ``generate_coco``'s paths and the box's instance
    index."""
    written = generate_coco(root, num_images=3, seed=0)
    with open(written['ann_file']) as f:
        coco = json.load(f)
    index = sum(a['image_id'] == 2 for a in coco['annotations'])
    coco['annotations'].append(
        dict(
            id=999,
            image_id=2,
            category_id=1,
            bbox=[-5.0, 10.0, 30.0, 30.0],
            area=900.0,
            iscrowd=0,
        )
    )
    with open(written['ann_file'], 'w') as f:
        json.dump(coco, f)
    return written, index


def test_coco_negative_coordinate_instance(tool, tmp_path):
    root = str(tmp_path / 'coco')
    written, index = coco_with_negative_box(root)
    code, report = run(tool, tmp_path, TINY_COCO_CONFIG, root)
    assert code == 1
    (problem,) = report['problems']
    assert problem['kind'] == 'negative_coord'
    # named where it lives: the json and the record's id (image 2 is
    # 000001.png)
    assert osp.samefile(problem['file'], written['ann_file'])
    assert problem['record'] == 'annotation id 999'
    assert problem['instance'] == index
    assert problem['values'] == [-5.0, 10.0, 25.0, 40.0]


def test_bad_invocations_exit_two(tool, tiny_dota_root, tmp_path, capsys):
    assert tool.main([str(tmp_path / 'missing.py')]) == 2
    assert 'does not exist' in capsys.readouterr().err
    code = tool.main(
        [
            TINY_DOTA_CONFIG,
            '--split',
            'val',
            '--cfg-options',
            f'train_dataloader.dataset.data_root={tiny_dota_root}/',
        ]
    )
    assert code == 2
    assert 'no val_dataloader' in capsys.readouterr().err
    with pytest.raises(SystemExit) as err:
        tool.main([TINY_DOTA_CONFIG, '--split', 'trainval'])
    assert err.value.code == 2


def test_command_line_exit_code_and_table(tmp_path):
    root = str(tmp_path / 'cityscapes')
    written = generate_cityscapes(root, num_images=2, stray_values=(34,))
    proc = subprocess.run(
        [
            sys.executable,
            TOOL,
            TINY_CITYSCAPES_CONFIG,
            '--cfg-options',
            f'train_dataloader.dataset.data_root={root}/',
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stderr
    seg_map = written['stray'][0]['seg_map']
    assert f'seg_values | 1     | {seg_map}' in proc.stdout
    assert '34: 192 px' in proc.stdout
