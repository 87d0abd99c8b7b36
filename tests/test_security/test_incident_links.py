# Copyright (c) mmnanguard contributors. All rights reserved.
"""Hostile incident folders: links, crafted report values, files that are
not what they claim. Nothing is written outside the folder, no value
leaves its line in ``report.md``, and every error names the file.

Against the tools as they were, ``replay --write`` wrote ``report.md``,
``report.json.tmp`` and ``timeline.png`` through the links a folder
carried (a dangling one created its target), and the report's strings
reached the Markdown with their newlines.
"""

import json
import os
import os.path as osp
import sys

import pytest
import torch
from mmengine.structures import InstanceData

from mmnanguard.engine.diagnosis.report_md import render_markdown
from mmnanguard.engine.incident import (
    IncidentRecorder,
    NotAnIncidentError,
    UnsafeIncidentFolderError,
    load_incident,
    load_model_state,
    write_incident_file,
    write_report_json,
)
from mmnanguard.testing.tiny_configs import MIM_ROOT

sys.path.insert(0, osp.join(MIM_ROOT, 'tools'))
import replay  # noqa: E402
from tree_snapshot import snapshot_tree as _snapshot  # noqa: E402

CONFIG = osp.join(
    MIM_ROOT, 'configs', 'tiny', 'retinanet_r18_fpn_tiny-coco.py'
)


@pytest.fixture
def incident(tmp_path):
    """An honest incident folder (written by the recorder) and a folder
    outside it that must stay as it is."""
    outside = tmp_path / 'outside'
    outside.mkdir()
    (outside / 'victim.pth').write_text('untouched\n')
    recorder = IncidentRecorder(str(tmp_path / 'work'), 5, 0, 1)
    folder = recorder.record(
        dict(iteration=1, kind='nonfinite_loss'),
        dict(
            data_batch=dict(inputs=[torch.ones(3)]), rng_state={}, iteration=1
        ),
    )
    return dict(folder=folder, outside=str(outside))


#: link name -> target (relative to the outside folder); None: dangling
LINKS = {
    'report.md': 'victim.pth',
    'timeline.png': 'victim.pth',
    'report.json.tmp': 'victim.pth',
    'model.pth': 'victim.pth',
    'dangling.md': None,
}


@pytest.mark.parametrize('name', sorted(LINKS))
def test_replay_refuses_a_folder_holding_a_link(incident, capsys, name):
    folder, outside = incident['folder'], incident['outside']
    target = LINKS[name] or 'created_by_replay.pth'
    link = osp.join(folder, name)
    os.symlink(osp.join(outside, target), link)
    before = _snapshot(osp.dirname(outside))
    assert replay.main([folder, '--config', CONFIG, '--write']) == 2
    err = capsys.readouterr().err
    assert err.startswith('replay: error: ') and link in err
    assert 'symbolic link' in err and 'Traceback' not in err
    assert len(err.strip().splitlines()) == 1
    assert _snapshot(osp.dirname(outside)) == before
    assert not osp.exists(osp.join(outside, 'created_by_replay.pth'))


def test_replay_refuses_a_folder_that_is_a_link(incident, tmp_path, capsys):
    link = str(tmp_path / 'incident_000_iter000001')
    os.symlink(incident['folder'], link)
    before = _snapshot(str(tmp_path))
    assert replay.main([link, '--config', CONFIG, '--write']) == 2
    err = capsys.readouterr().err
    assert link in err and 'symbolic link' in err
    assert _snapshot(str(tmp_path)) == before


@pytest.mark.parametrize('name', ['report.md', 'timeline.png', 'report.json'])
def test_writer_replaces_a_link_never_writes_through_it(incident, name):
    """During training a planted link in the folder is replaced by the
    file; its target is untouched (and a dangling one is not created)."""
    folder, outside = incident['folder'], incident['outside']
    if osp.exists(osp.join(folder, name)):
        os.unlink(osp.join(folder, name))
    os.symlink(osp.join(outside, 'victim.pth'), osp.join(folder, name))
    os.symlink(osp.join(outside, 'new.pth'), osp.join(folder, name + '.tmp'))
    write_incident_file(folder, name, b'written')
    assert not osp.islink(osp.join(folder, name))
    with open(osp.join(folder, name), 'rb') as f:
        assert f.read() == b'written'
    with open(osp.join(outside, 'victim.pth')) as f:
        assert f.read() == 'untouched\n'
    assert os.listdir(outside) == ['victim.pth']


def test_writer_refuses_a_folder_that_is_a_link(incident, tmp_path):
    link = str(tmp_path / 'linked_folder')
    os.symlink(incident['outside'], link)
    with pytest.raises(UnsafeIncidentFolderError) as err:
        write_report_json(dict(kind='x'), link)
    assert link in str(err.value) and 'symbolic link' in str(err.value)
    assert os.listdir(incident['outside']) == ['victim.pth']


def _report(**values):
    report = dict(
        iteration=4,
        kind='nonfinite_loss',
        epoch=1,
        rank=0,
        action='skip',
        nonfinite_terms={'loss_cls': 'nan'},
        grad_norm=None,
        cause='data',
        stage='forward',
        reproduced=True,
        samples=[],
        diagnosis=dict(
            remedy=['fix the data'], summary='bad box', replay_state='s'
        ),
        evidence=dict(
            data=[],
            replay=dict(
                precision='fp32',
                loss_terms={},
                backward_ran=False,
                finite=False,
                anomaly='line one\nline two ``` fence',
            ),
        ),
    )
    report.update(values)
    return report


def test_report_values_stay_on_their_line():
    hostile = dict(
        action='skip\nimport os; os.system("touch /tmp/x")',
        epoch='1\r\n# injected heading',
        nonfinite_terms={'loss\n## term': 'nan\x1b[31m'},
        cause='data\u2028injected',
    )
    text = render_markdown(_report(**hostile))
    lines = text.splitlines()
    assert not any(line.startswith('import os') for line in lines)
    assert not any(line.startswith('# injected') for line in lines)
    assert not any(line.startswith('## term') for line in lines)
    assert '\x1b' not in text and '\r' not in text and '\u2028' not in text
    assert 'action: skip import os; os.system("touch /tmp/x")' in text
    assert 'epoch 1  # injected heading' in text
    # the anomaly keeps its lines, inside one code block
    assert "```\nline one\nline two ''' fence\n```" in text
    assert text.count('```') == 2


def test_batch_line_names_each_sample_by_what_it_carries():
    samples = [
        dict(img_path='/data/a/0001.png', img_id=None, seg_map_path=None),
        dict(
            img_path='/data/v/clip_7.mp4',
            img_id=None,
            seg_map_path=None,
            path_field='filename',
        ),
        dict(img_path=None, img_id=12, seg_map_path=None),
        dict(img_path=None, img_id=None, seg_map_path=None),
    ]
    lines = render_markdown(_report(samples=samples)).splitlines()
    assert (
        '- batch: 0001.png, clip_7.mp4 (filename), image id 12, '
        'a sample that names no file'
    ) in lines


def _write_report(folder, text):
    path = osp.join(folder, 'report.json')
    os.unlink(path)
    with open(path, 'w') as f:
        f.write(text)
    return path


def test_deep_report_is_named(incident, capsys):
    folder = incident['folder']
    path = _write_report(folder, '[' * 100000 + ']' * 100000)
    with pytest.raises(NotAnIncidentError) as err:
        load_incident(folder)
    assert path in str(err.value) and 'nested' in str(err.value)
    assert replay.main([folder, '--config', CONFIG]) == 2
    err = capsys.readouterr().err
    assert path in err and 'Traceback' not in err
    # deep, but within what JSON reads: refused by the report check
    nested = '{"kind": "nonfinite_loss", "iteration": 1, "x": ' + (
        '[' * 500 + ']' * 500 + '}'
    )
    _write_report(folder, nested)
    with pytest.raises(NotAnIncidentError, match='levels deep') as err:
        load_incident(folder)
    assert path in str(err.value)


def test_report_linked_to_proc_is_named(incident, capsys):
    folder = incident['folder']
    path = osp.join(folder, 'report.json')
    os.unlink(path)
    os.symlink('/proc/self/pagemap', path)
    assert replay.main([folder, '--config', CONFIG]) == 2
    err = capsys.readouterr().err
    assert path in err and '/proc/self/pagemap' in err
    assert 'Traceback' not in err


def test_report_that_is_not_a_regular_file_is_named(incident):
    folder = incident['folder']
    path = osp.join(folder, 'report.json')
    os.unlink(path)
    os.mkfifo(path)  # a reader that opened it plainly would block
    with pytest.raises(NotAnIncidentError) as err:
        load_incident(folder)
    assert path in str(err.value) and 'not a regular file' in str(err.value)


@pytest.mark.parametrize(
    'key, value, named',
    [
        ('loss_scale', 'x', "loss_scale='x' is of type str"),
        ('history', [1], 'an entry of history is 1'),
        ('epoch', [1], 'epoch=[1] is of type list'),
    ],
)
def test_report_value_of_the_wrong_type_is_named(
    incident, capsys, key, value, named
):
    folder = incident['folder']
    path = osp.join(folder, 'report.json')
    with open(path) as f:
        report = json.load(f)
    report[key] = value
    write_report_json(report, folder)
    assert replay.main([folder, '--config', CONFIG]) == 2
    err = capsys.readouterr().err
    assert path in err and named in err and 'Traceback' not in err


def test_data_sample_whose_fields_shadow_its_methods_is_named(tmp_path):
    from mmdet.structures import DetDataSample

    sample = DetDataSample(metainfo=dict(img_shape=(4, 4)))
    sample.gt_instances = InstanceData(labels=torch.tensor([1]))
    sample.__dict__['to'] = torch.ones(1)  # what a crafted BUILD sets
    recorder = IncidentRecorder(str(tmp_path), 5, 0, 1)
    folder = recorder.record(
        dict(iteration=1, kind='nonfinite_loss'),
        dict(
            data_batch=dict(data_samples=[sample]), rng_state={}, iteration=1
        ),
    )
    with pytest.raises(NotAnIncidentError) as err:
        load_incident(folder)
    message = str(err.value)
    assert osp.join(folder, 'batch.pth') in message
    assert "field 'to' that shadows DetDataSample.to" in message
    # an honest sample loads
    del sample.__dict__['to']
    folder = recorder.record(
        dict(iteration=2, kind='nonfinite_loss'),
        dict(
            data_batch=dict(data_samples=[sample]), rng_state={}, iteration=2
        ),
    )
    _, batch = load_incident(folder)
    loaded = batch['data_batch']['data_samples'][0]
    assert torch.equal(loaded.gt_instances.labels, torch.tensor([1]))


def test_truncated_model_file_is_named(tmp_path):
    path = str(tmp_path / 'model.pth')
    torch.save(dict(w=torch.ones(1000)), path)
    with open(path, 'r+b') as f:
        f.truncate(os.path.getsize(path) // 2)
    with pytest.raises(NotAnIncidentError) as err:
        load_model_state(path)
    assert path in str(err.value) and 'truncated' in str(err.value)


def test_config_inside_the_folder_needs_trust(incident, capsys):
    folder = incident['folder']
    marker = osp.join(incident['outside'], 'marker')
    config = osp.join(folder, 'config.py')
    with open(config, 'w') as f:
        f.write(f"_x = __import__('os').system('touch {marker}')\n")
    for path in (
        config,
        osp.join(folder, '..', osp.basename(folder), 'config.py'),
    ):
        assert replay.main([folder, '--config', path]) == 2
        err = capsys.readouterr().err
        assert 'inside the incident folder' in err and '--trust-config' in err
        assert not osp.exists(marker)
