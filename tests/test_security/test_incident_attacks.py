# Copyright (c) mmnanguard contributors. All rights reserved.
"""Crafted incident folders run nothing: ``load_incident`` and replay.

Against the loader as it was (``weights_only=False`` after a scan of
module prefixes), every ``batch.pth`` below created its marker file, and
``tools/replay.py INCIDENT_DIR`` ran the folder's ``config.py``. Now the
batch is refused before anything runs, naming the file and the global or
the call, and replay uses no code from the folder unless asked.
"""

import json
import os
import os.path as osp
import shutil
import sys

import crafted_files as crafted
import pytest
import torch

from mmnanguard.engine.diagnosis import NotAnIncidentError, load_incident
from mmnanguard.engine.incident import UntrustedIncidentError
from mmnanguard.testing.tiny_configs import MIM_ROOT

sys.path.insert(0, osp.join(MIM_ROOT, 'tools'))
import replay  # noqa: E402

DIR_NAME = 'incident_000_iter000001'


def _hub(folder, marker):
    with open(osp.join(folder, 'hubconf.py'), 'w') as f:
        f.write(f"__import__('os').system('touch {marker}')\n")
    return crafted.hub_load_local(folder)


def _fromfile(folder, marker):
    path = osp.join(folder, 'notes.py')
    with open(path, 'w') as f:
        f.write(f"x = __import__('os').system('touch {marker}')\n")
    return crafted.getattr_config_fromfile(path)


def _nested_load(folder, marker):
    inner = osp.join(folder, 'inner.pth')
    torch.save(crafted.Call(os.system, f'touch {marker}'), inner)
    return crafted.nested_torch_load(inner)


def _numpy_load(folder, marker):
    inner = osp.join(folder, 'inner.pkl')
    with open(inner, 'wb') as f:
        f.write(crafted.foreign_call(marker))
    return crafted.numpy_load_pickle(inner)


#: attack -> (payload(folder, marker), what the error must name)
ATTACKS = {
    'collect_env_run': (
        lambda folder, marker: crafted.collect_env_run(marker),
        'torch.utils.collect_env.run',
    ),
    'numpy_runstring': (
        lambda folder, marker: crafted.numpy_runstring(marker),
        'numpy.testing._private.utils.runstring',
    ),
    'nested_torch_load': (_nested_load, 'torch.serialization.load'),
    'numpy_load_allow_pickle': (_numpy_load, 'numpy.load'),
    'torch_hub_load_local': (_hub, 'torch.hub._load_local'),
    'getattr_config_fromfile': (_fromfile, 'builtins.getattr'),
    'dotted_global_proto4': (
        lambda folder, marker: crafted.dotted_global_proto4(marker),
        'torch.os.system',
    ),
    'builtins_setattr': (
        lambda folder, marker: crafted.builtins_setattr(marker),
        'builtins.setattr',
    ),
    'getattr_to_module_globals': (
        lambda folder, marker: crafted.getattr_to_module_globals(marker),
        'builtins.getattr',
    ),
}


def _folder(tmp_path, attack, marker, fmt='zip'):
    """An incident folder whose name and report are consistent."""
    folder = str(tmp_path / DIR_NAME)
    os.makedirs(folder)
    with open(osp.join(folder, 'report.json'), 'w') as f:
        json.dump(dict(kind='nonfinite_loss', iteration=1), f)
    payload = ATTACKS[attack][0](folder, marker)
    batch = crafted.WRITERS[fmt](osp.join(folder, 'batch.pth'), payload)
    return folder, batch


@pytest.mark.parametrize('attack', sorted(ATTACKS))
def test_crafted_batch_is_refused_by_load_incident(tmp_path, attack):
    marker = str(tmp_path / 'marker')
    folder, batch = _folder(tmp_path, attack, marker)
    with pytest.raises(UntrustedIncidentError) as err:
        load_incident(folder)
    assert not osp.exists(marker)
    assert batch in str(err.value) and ATTACKS[attack][1] in str(err.value)
    # still the error callers catch for a folder that is not an incident
    assert isinstance(err.value, NotAnIncidentError)


@pytest.mark.parametrize(
    'attack', ['collect_env_run', 'getattr_to_module_globals']
)
def test_crafted_legacy_batch_is_refused(tmp_path, attack):
    marker = str(tmp_path / 'marker')
    folder, batch = _folder(tmp_path, attack, marker, fmt='legacy')
    with pytest.raises(UntrustedIncidentError) as err:
        load_incident(folder)
    assert not osp.exists(marker)
    assert batch in str(err.value)
    assert ATTACKS[attack][1].rsplit('.', 1)[1] in str(err.value)


@pytest.mark.parametrize('attack', ['collect_env_run', 'numpy_runstring'])
def test_crafted_batch_is_refused_by_replay(tmp_path, capsys, attack):
    marker = str(tmp_path / 'marker')
    folder, batch = _folder(tmp_path, attack, marker)
    config = osp.join(
        MIM_ROOT, 'configs', 'tiny', 'retinanet_r18_fpn_tiny-coco.py'
    )
    assert replay.main([folder, '--config', config]) == 2
    err = capsys.readouterr().err
    assert err.startswith('replay: error: ') and batch in err
    assert 'Traceback' not in err
    assert not osp.exists(marker)


@pytest.fixture(scope='module')
def honest_incident(real_runs):
    """A real incident folder (RetinaNet on COCO, inf loss at iter 1)."""
    run = real_runs('retinanet_coco')
    return dict(folder=run['incident'], config=run['config'])


def _copy(honest, tmp_path):
    folder = str(tmp_path / DIR_NAME)
    shutil.copytree(honest['folder'], folder)
    return folder


def test_replay_runs_no_config_from_the_folder(
    honest_incident, tmp_path, capsys
):
    marker = str(tmp_path / 'marker')
    folder = _copy(honest_incident, tmp_path)
    with open(osp.join(folder, 'config.py'), 'a') as f:
        f.write(f"\n_x = __import__('os').system('touch {marker}')\n")
    assert replay.main([folder]) == 2
    err = capsys.readouterr().err
    assert '--config' in err and '--trust-config' in err
    assert not osp.exists(marker)
    # the user's own config: replays, and the folder's file never ran
    config = honest_incident['config']
    assert replay.main([folder, '--config', config]) == 0
    assert 'nonfinite_loss' in capsys.readouterr().out
    assert not osp.exists(marker)
    # asked for: the folder's config runs (and here, its payload)
    assert replay.main([folder, '--trust-config']) == 0
    assert osp.exists(marker)


def test_replay_refuses_a_crafted_model_file(
    honest_incident, tmp_path, capsys
):
    marker = str(tmp_path / 'marker')
    folder = _copy(honest_incident, tmp_path)
    model = osp.join(folder, 'model.pth')
    crafted.write_zip(model, crafted.getattr_to_module_globals(marker))
    config = honest_incident['config']
    assert replay.main([folder, '--config', config]) == 2
    err = capsys.readouterr().err
    assert model in err and 'builtins.getattr' in err
    assert not osp.exists(marker)


def test_replay_refuses_a_model_file_that_is_not_a_state_dict(
    honest_incident, tmp_path, capsys
):
    folder = _copy(honest_incident, tmp_path)
    model = osp.join(folder, 'model.pth')
    torch.save([torch.ones(1)], model)
    config = honest_incident['config']
    assert replay.main([folder, '--config', config]) == 2
    err = capsys.readouterr().err
    assert model in err and 'state dict' in err


@pytest.mark.parametrize(
    'text, named',
    [
        ('{not json', 'not JSON'),
        ('[1, 2]', 'expected a JSON object, got list'),
        ('{"kind": "os.system", "iteration": 1}', "kind='os.system'"),
    ],
)
def test_replay_names_a_report_that_is_not_one(
    honest_incident, tmp_path, capsys, text, named
):
    folder = _copy(honest_incident, tmp_path)
    report = osp.join(folder, 'report.json')
    with open(report, 'w') as f:
        f.write(text)
    assert replay.main([folder, '--config', honest_incident['config']]) == 2
    err = capsys.readouterr().err
    assert report in err and named in err and 'Traceback' not in err


def test_replay_command_line_refuses_in_one_line(honest_incident, tmp_path):
    import subprocess

    marker = str(tmp_path / 'marker')
    folder = _copy(honest_incident, tmp_path)
    with open(osp.join(folder, 'config.py'), 'a') as f:
        f.write(f"\n_x = __import__('os').system('touch {marker}')\n")
    done = subprocess.run(
        [sys.executable, osp.join(MIM_ROOT, 'tools', 'replay.py'), folder],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=MIM_ROOT,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith('replay: error: ')
    assert 'Traceback' not in done.stderr and '--trust-config' in done.stderr
    assert not osp.exists(marker)
