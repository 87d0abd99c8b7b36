# Copyright (c) mmnanguard contributors. All rights reserved.
"""Decompression bombs: a 16 MB ``torch.save`` file whose zip entry
declares 16 GiB (a real deflated stream of zeros, CRC left at 0).

Against the code as it was, the cheap verifier read ``data.pkl`` in full
(``MemoryError``, exit 1) on a plain ``--resume``, a ``--resume FILE``
and a rollback from checkpoint, and torch's reader allocated a
``batch.pth`` or ``model.pth`` record at its declared size. Every reader
now checks the declared sizes in the zip central directory first
(:mod:`mmnanguard.compat.declared_sizes`) and refuses the file by name,
in milliseconds, without allocating: measured here in a fresh process
(time and peak RSS), next to an unguarded read of a smaller bomb that
shows the measurement sees an allocation.
"""

import json
import os
import os.path as osp
import shutil
import subprocess
import sys
import zipfile

import crafted_files as crafted
import pytest
import torch
from toy_runs import protected_toy_runner

from mmnanguard.compat.declared_sizes import (
    MAX_INFLATION,
    DeclaredSizeError,
    check_declared_sizes,
    size_problem,
)
from mmnanguard.compat.safe_load import weights_only_load
from mmnanguard.engine.incident import (
    NotAnIncidentError,
    load_batch,
    load_model_state,
)
from mmnanguard.engine.runner import (
    UnusableCheckpointError,
    checkpoint_problem,
    choose_resume_checkpoint,
    verified_checkpoints,
)

GiB = 1 << 30
BOMB = 16 * GiB
REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    """``iter_1.pth`` .. ``iter_3.pth`` of a protected toy run."""
    work_dir = tmp_path_factory.mktemp('trained')
    protected_toy_runner(work_dir, 3).train()
    return str(work_dir)


@pytest.fixture
def work(trained, tmp_path):
    """A work dir with copies of the three checkpoints (times kept) and no
    ``last_checkpoint``; the newest is a bomb."""
    work_dir = tmp_path / 'work'
    work_dir.mkdir()
    for n in (1, 2, 3):
        shutil.copy2(ckpt(trained, n), work_dir)
    crafted.write_bomb(ckpt(str(work_dir), 3), 'data.pkl', BOMB)
    return str(work_dir)


def ckpt(work_dir, n) -> str:
    return osp.join(work_dir, f'iter_{n}.pth')


def incident_files(folder) -> dict:
    """A ``batch.pth`` and a ``model.pth`` as the incident writers save
    them, each with one 16 GiB record."""
    os.makedirs(folder, exist_ok=True)
    files = {
        'batch.pth': dict(
            data_batch=dict(inputs=[torch.ones(4)]), rng_state={}, iteration=1
        ),
        'model.pth': {'weight': torch.ones(4)},
    }
    paths = {}
    for name, obj in files.items():
        paths[name] = osp.join(folder, name)
        torch.save(obj, paths[name])
        crafted.write_bomb(paths[name], 'data/0', BOMB)
    return paths


def test_real_files_pass_the_size_check(trained, tmp_path):
    assert size_problem(ckpt(trained, 3)) is None
    plain = str(tmp_path / 'plain.pth')
    torch.save({'weight': torch.ones(1000)}, plain)
    assert size_problem(plain) is None
    assert weights_only_load(plain, [], 'weights')['weight'].sum() == 1000


@pytest.mark.parametrize('entry', ['data.pkl', 'data/0'])
def test_an_inflating_entry_is_named(tmp_path, entry):
    path = str(tmp_path / 'bomb.pth')
    torch.save({'weight': torch.ones(1000)}, path)
    crafted.write_bomb(path, entry, BOMB)
    assert 15 << 20 < osp.getsize(path) < 18 << 20  # a 16 MB file
    with zipfile.ZipFile(path) as archive:  # declared as the readers see it
        (info,) = [i for i in archive.infolist() if i.filename.endswith(entry)]
        assert info.file_size == BOMB
    problem = size_problem(path)
    assert f"entry 'bomb/{entry}' declares 16.0 GiB" in problem
    assert 'decompression bomb' in problem
    with pytest.raises(DeclaredSizeError) as info:
        check_declared_sizes(path, 'checkpoint')
    assert path in str(info.value) and 'Nothing was read' in str(info.value)


def test_entries_sharing_their_bytes_are_counted_together(tmp_path):
    """The overlapping bomb: many directory entries, one stored record;
    each entry alone is no larger than the file."""
    path = str(tmp_path / 'overlap.pth')
    torch.save({'weight': torch.ones(1 << 18)}, path)  # a 1 MiB record
    with zipfile.ZipFile(path, 'a') as archive:
        (record,) = [
            i for i in archive.infolist() if i.filename.endswith('data/0')
        ]
        for n in range(1, MAX_INFLATION + 2):
            copy = zipfile.ZipInfo(f'overlap/data/{n}')
            for key in ('header_offset', 'file_size', 'compress_size', 'CRC'):
                setattr(copy, key, getattr(record, key))
            archive.filelist.append(copy)
        archive._didModify = True
    assert 'entries declare' in size_problem(path)
    assert 'in all, more than' in size_problem(path)


def test_verifier_passes_over_a_bomb(work):
    problem = checkpoint_problem(ckpt(work, 3))
    assert "'archive/data.pkl' declares 16.0 GiB" in problem
    assert checkpoint_problem(ckpt(work, 3), load=True) == problem
    # what a rollback from checkpoint and a plain resume pick from
    assert verified_checkpoints(work) == [ckpt(work, 2), ckpt(work, 1)]


def test_plain_resume_takes_the_newest_checkpoint_that_fits(work):
    choice = choose_resume_checkpoint(work)
    assert choice.path == ckpt(work, 2)
    assert 'decompression bomb' in choice.message()
    runner = protected_toy_runner(work, 3, resume=True)
    runner.train()
    assert runner.iter == 3


def test_named_bomb_without_fallback_is_refused_by_name(work, tmp_path):
    empty = tmp_path / 'empty'
    empty.mkdir()
    bomb = str(tmp_path / 'iter_9.pth')
    shutil.copy(ckpt(work, 3), bomb)
    with pytest.raises(UnusableCheckpointError) as info:
        choose_resume_checkpoint(str(empty), bomb)
    assert bomb in str(info.value) and '16.0 GiB' in str(info.value)
    runner = protected_toy_runner(tmp_path / 'finetune', 1, load_from=bomb)
    with pytest.raises(UnusableCheckpointError) as info:
        runner.train()  # load_from, not resuming
    assert f"load_from='{bomb}'" in str(info.value)
    assert 'decompression bomb' in str(info.value)


def test_incident_files_with_a_huge_record_are_refused(tmp_path):
    paths = incident_files(str(tmp_path / 'incident_000_iter000001'))
    with pytest.raises(NotAnIncidentError) as info:
        load_batch(paths['batch.pth'])
    assert paths['batch.pth'] in str(info.value)
    assert "'batch/data/0' declares 16.0 GiB" in str(info.value)
    with pytest.raises(NotAnIncidentError) as info:
        load_model_state(paths['model.pth'])
    assert paths['model.pth'] in str(info.value)
    assert 'decompression bomb' in str(info.value)


def test_train_tool_refuses_a_named_bomb_with_exit_2(
    work, tiny_dota_root, tmp_path, capsys
):
    """``tools/train.py --resume FILE``: one paragraph naming the file."""
    sys.path.insert(0, osp.join(REPO, 'tools'))
    import train

    from mmnanguard.testing import TINY_DOTA_CONFIG

    bomb = str(tmp_path / 'iter_9.pth')
    shutil.copy(ckpt(work, 3), bomb)
    code = train.main(
        [
            TINY_DOTA_CONFIG,
            '--work-dir',
            str(tmp_path / 'tool_work'),
            '--guard',
            'skip',
            '--resume',
            bomb,
            '--cfg-options',
            f'train_dataloader.dataset.data_root={tiny_dota_root}/',
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith('tools/train.py: UnusableCheckpointError:')
    assert bomb in err and 'decompression bomb' in err
    assert 'Traceback' not in err


#: Run in a fresh process: each reader on the 16 GiB bombs (a zip entry;
#: a legacy-format storage), its time and
#: the growth of the peak RSS; last, an unguarded zipfile read of a
#: 128 MiB bomb (the control: the measurement sees an allocation).
MEASURE = r"""
import json, resource, sys, time, zipfile
from mmnanguard.compat.checkpoint_allowlist import load_from_local
from mmnanguard.engine.incident import load_batch, load_model_state
from mmnanguard.fileio.checkpoint_verify import checkpoint_problem

checkpoint, batch, model, control, legacy = sys.argv[1:6]


def peak_mb():
    # the process's peak resident size (VmHWM), in MB
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith('VmHWM:'):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_peak():
    # lower the peak to the present size (Linux >= 4.0), so that the
    # imports' peak cannot hide what a call allocates
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
    except OSError:
        pass


def measure(call):
    reset_peak()
    before, start = peak_mb(), time.perf_counter()
    try:
        call()
        outcome = 'returned'
    except Exception as err:
        outcome = type(err).__name__
    return dict(
        seconds=time.perf_counter() - start,
        rss_mb=peak_mb() - before,
        outcome=outcome,
    )


found = {
    'cheap check': measure(lambda: checkpoint_problem(checkpoint)),
    'full check': measure(lambda: checkpoint_problem(checkpoint, True)),
    'load_from_local': measure(lambda: load_from_local(checkpoint)),
    'load_batch': measure(lambda: load_batch(batch)),
    'load_model_state': measure(lambda: load_model_state(model)),
    'legacy load_from_local': measure(lambda: load_from_local(legacy)),
}
with zipfile.ZipFile(control) as archive:
    found['control'] = measure(lambda: archive.read('bomb/data.pkl'))
print(json.dumps(found))
"""


@pytest.mark.slow  # the fresh process imports the stack (about 30 s)
def test_refusal_is_fast_and_allocates_nothing(work, tmp_path):
    paths = incident_files(str(tmp_path / 'incident_000_iter000001'))
    control = str(tmp_path / 'bomb.pth')
    torch.save({}, control)
    crafted.write_bomb(control, 'data.pkl', 128 << 20)
    legacy = crafted.write_legacy_storage_bomb(
        str(tmp_path / 'legacy.pth'), {'w': torch.zeros(4)}, 4 * GiB
    )
    script = tmp_path / 'measure.py'
    script.write_text(MEASURE)
    env = dict(os.environ, OMP_NUM_THREADS='1', MKL_NUM_THREADS='1')
    result = subprocess.run(
        [
            sys.executable,
            str(script),
            ckpt(work, 3),
            paths['batch.pth'],
            paths['model.pth'],
            control,
            legacy,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    print(json.dumps(found, indent=1))  # shown with -s
    expected = {
        'cheap check': 'returned',  # the reason, as a phrase
        'full check': 'returned',
        'load_from_local': 'DeclaredSizeError',
        'load_batch': 'NotAnIncidentError',
        'load_model_state': 'NotAnIncidentError',
        'legacy load_from_local': 'DeclaredSizeError',
    }
    for name, outcome in expected.items():
        assert found[name]['outcome'] == outcome, (name, found)
        assert found[name]['seconds'] < 1.0, (name, found)
        assert found[name]['rss_mb'] < 100, (name, found)
    # the unguarded read inflates (CRC 0: BadZipFile once it has)
    assert found['control']['outcome'] == 'BadZipFile', found
    assert found['control']['rss_mb'] > 100, found
