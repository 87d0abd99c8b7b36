# Copyright (c) mmnanguard contributors. All rights reserved.
"""Incident folders on disk: numbering, atomic writes, full disks, kills,
folders a resume discarded."""

import errno
import json
import os
import os.path as osp
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
import torch
from mmengine.logging import MMLogger

from mmnanguard.engine.incident import (
    BATCH_NAME,
    DISCARDED_NAME,
    REPORT_NAME,
    IncidentKind,
    IncidentRecorder,
    NotAnIncidentError,
    load_incident,
    load_report,
    mark_discarded,
    safe_write,
    write_incident_file,
)


@pytest.fixture
def log_file(tmp_path):
    """A fresh current MMLogger writing to a file; returns its reader."""
    path = str(tmp_path / 'run.log')
    MMLogger.get_instance(f'incident_{uuid.uuid4().hex}', log_file=path)

    def read():
        with open(path) as f:
            return f.read()

    return read


def _record(root, iteration=5, kind='nonfinite_loss', **kwargs):
    recorder = IncidentRecorder(str(root), 10, rank=0, world_size=1)
    report = dict(iteration=iteration, kind=kind)
    batch = dict(
        data_batch=dict(inputs=[torch.arange(3.0)]),
        rng_state={},
        iteration=iteration,
    )
    return recorder, report, recorder.record(report, batch, **kwargs)


def _entries(root):
    return sorted(os.listdir(osp.join(str(root), 'nanguard')))


def test_folder_holds_the_report_and_the_batch(tmp_path):
    _, report, folder = _record(tmp_path, iteration=12)
    assert folder == osp.join(
        str(tmp_path), 'nanguard', 'incident_000_iter000012'
    )
    assert sorted(os.listdir(folder)) == [BATCH_NAME, REPORT_NAME]
    assert report['report_path'] == osp.join(folder, REPORT_NAME)
    loaded, batch = load_incident(folder)
    assert loaded == dict(
        iteration=12, kind='nonfinite_loss', report_path=report['report_path']
    )
    assert torch.equal(batch['data_batch']['inputs'][0], torch.arange(3.0))


def test_numbers_come_from_the_disk(tmp_path):
    """A folder from a part of the run a resume discarded keeps its number;
    the next incident takes the one after the highest on disk."""
    root = tmp_path / 'nanguard'
    os.makedirs(root / 'incident_003_iter000009')
    os.makedirs(root / 'incident_001_iter000004_rank1')
    os.makedirs(root / 'not_an_incident_007')
    _, _, folder = _record(tmp_path, iteration=4)
    assert osp.basename(folder) == 'incident_004_iter000004'
    _, _, folder = _record(tmp_path, iteration=6)
    assert osp.basename(folder) == 'incident_005_iter000006'


def test_ranks_share_the_number_of_one_incident(tmp_path):
    rank0 = IncidentRecorder(str(tmp_path), 5, rank=0, world_size=2)
    rank1 = IncidentRecorder(str(tmp_path), 5, rank=1, world_size=2)
    first = rank0.record(dict(iteration=3, kind='nonfinite_grad'))
    second = rank1.record(dict(iteration=3, kind='nonfinite_grad'))
    third = rank1.record(dict(iteration=8, kind='nonfinite_grad'))
    assert [osp.basename(f) for f in (first, second, third)] == [
        'incident_000_iter000003_rank0',
        'incident_000_iter000003_rank1',
        'incident_001_iter000008_rank1',
    ]


def test_rename_never_replaces_an_existing_folder(tmp_path):
    """Where the name exists (an empty folder, which rename(2) would
    replace), the rename refuses and leaves both alone."""
    root = str(tmp_path)
    os.makedirs(osp.join(root, 'src'))
    with open(osp.join(root, 'src', 'f'), 'w') as f:
        f.write('new')
    os.makedirs(osp.join(root, 'dst'))
    fd = os.open(root, os.O_RDONLY)
    try:
        assert not safe_write.rename_noreplace(fd, 'src', 'dst')
        assert os.listdir(osp.join(root, 'dst')) == []
        assert safe_write.rename_noreplace(fd, 'src', 'fresh')
    finally:
        os.close(fd)
    assert os.listdir(osp.join(root, 'fresh')) == ['f']


@pytest.mark.parametrize('kind', [k.value for k in IncidentKind])
def test_every_kind_loads(tmp_path, kind):
    _, _, folder = _record(tmp_path, iteration=2, kind=kind)
    report, batch = load_incident(folder)
    assert report['kind'] == kind and batch['iteration'] == 2


def test_bound_and_force(tmp_path, log_file):
    recorder = IncidentRecorder(str(tmp_path), 1, rank=0, world_size=1)
    assert recorder.record(dict(iteration=1, kind='nonfinite_loss'))
    assert recorder.record(dict(iteration=2, kind='nonfinite_loss')) is None
    assert 'max_incidents=1' in log_file()
    forced = recorder.record(
        dict(iteration=3, kind='nonfinite_loss'), force=True
    )
    assert osp.basename(forced) == 'incident_001_iter000003'
    # a new recorder on the same work dir counts the folders on disk
    again = IncidentRecorder(str(tmp_path), 2, rank=0, world_size=1)
    assert again.written == 2
    assert again.record(dict(iteration=4, kind='nonfinite_loss')) is None


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_full_disk_in_batch_write_is_logged_not_raised(
    tmp_path, monkeypatch, log_file
):
    def save(obj, f, *args, **kwargs):
        f.write(b'PK\x03\x04 half a batch')  # some bytes reach the disk
        _enospc()

    monkeypatch.setattr(torch, 'save', save)
    recorder, report, folder = _record(tmp_path, iteration=7)
    assert folder is None
    assert _entries(tmp_path) == []  # no temporary and no partial folder
    log = log_file()
    assert 'could not write the incident folder' in log
    assert 'No space left on device' in log
    assert osp.join(str(tmp_path), 'nanguard', '.tmp_incident_') in log
    assert 'report_path' not in report
    assert 'No space left on device' in report['write_error']
    assert recorder.written == 0


def test_full_disk_at_fsync_is_logged_not_raised(
    tmp_path, monkeypatch, log_file
):
    """A file system that reports the full disk only at fsync (delayed
    allocation): the same."""
    monkeypatch.setattr(os, 'fsync', _enospc)
    _, _, folder = _record(tmp_path, iteration=7)
    assert folder is None
    assert _entries(tmp_path) == []
    assert 'No space left on device' in log_file()


def test_unpicklable_batch_is_logged_not_raised(tmp_path, log_file):
    recorder = IncidentRecorder(str(tmp_path), 5, rank=0, world_size=1)
    batch = dict(data_batch=lambda: None, rng_state={}, iteration=1)
    assert (
        recorder.record(dict(iteration=1, kind='nonfinite_loss'), batch)
        is None
    )
    assert _entries(tmp_path) == []
    assert 'could not write the incident folder' in log_file()


def test_work_dir_link_is_not_followed(tmp_path, log_file):
    """A ``nanguard`` link planted in the work dir: nothing is written
    through it."""
    outside = tmp_path / 'outside'
    outside.mkdir()
    work_dir = tmp_path / 'work'
    work_dir.mkdir()
    os.symlink(str(outside), str(work_dir / 'nanguard'))
    _, _, folder = _record(work_dir, iteration=1)
    assert folder is None
    assert os.listdir(str(outside)) == []
    assert 'symbolic link' in log_file()


def test_folder_with_only_a_temporary_file_is_named_unfinished(tmp_path):
    folder = tmp_path / 'incident_000_iter000003'
    folder.mkdir()
    (folder / 'batch.pth.tmp').write_bytes(b'PK\x03\x04')
    with pytest.raises(NotAnIncidentError) as err:
        load_incident(str(folder))
    message = str(err.value)
    assert 'interrupted' in message and 'batch.pth.tmp' in message
    assert 'save_batch' not in message
    unfinished = tmp_path / '.tmp_incident_0123456789ab'
    unfinished.mkdir()
    with pytest.raises(NotAnIncidentError, match='unfinished incident folder'):
        load_incident(str(unfinished))


def test_truncated_batch_is_named(tmp_path):
    _, _, folder = _record(tmp_path, iteration=3)
    path = osp.join(folder, BATCH_NAME)
    with open(path, 'r+b') as f:
        f.truncate(os.path.getsize(path) // 2)
    with pytest.raises(NotAnIncidentError) as err:
        load_incident(folder)
    assert path in str(err.value) and 'not a complete torch file' in str(
        err.value
    )


def test_write_incident_file_replaces_and_leaves_no_temporary(tmp_path):
    folder = str(tmp_path)
    write_incident_file(folder, 'report.md', 'first')
    path = write_incident_file(folder, 'report.md', b'second')
    write_incident_file(folder, 'model.pth', lambda f: torch.save([1], f))
    assert path == osp.join(folder, 'report.md')
    assert open(path).read() == 'second'
    assert sorted(os.listdir(folder)) == ['model.pth', 'report.md']
    with pytest.raises(ValueError, match='plain file name'):
        write_incident_file(folder, '../escape.md', 'x')


def test_write_incident_file_failure_keeps_the_old_file(tmp_path):
    folder = str(tmp_path)
    write_incident_file(folder, 'report.md', 'old')

    def fail(f):
        f.write(b'partial')
        _enospc()

    with pytest.raises(OSError) as err:
        write_incident_file(folder, 'report.md', fail)
    assert err.value.errno == errno.ENOSPC
    assert err.value.filename == osp.join(folder, 'report.md')  # named
    assert os.listdir(folder) == ['report.md']
    assert open(osp.join(folder, 'report.md')).read() == 'old'


def test_fill_writes_in_the_temporary_folder_before_the_report(
    tmp_path, incident_writes
):
    seen = {}

    def fill(files_folder, folder):
        seen.update(files_folder=files_folder, folder=folder)
        assert sorted(os.listdir(files_folder)) == [BATCH_NAME]
        assert not osp.exists(folder)
        write_incident_file(files_folder, 'report.md', 'diagnosed')
        return dict(report, cause='data')

    report = dict(iteration=5, kind='nonfinite_loss')
    recorder = IncidentRecorder(str(tmp_path), 10, rank=0, world_size=1)
    folder = recorder.record(report, dict(data_batch={}), fill=fill)
    root = osp.join(str(tmp_path), 'nanguard')
    assert (
        folder == seen['folder'] == osp.join(root, 'incident_000_iter000005')
    )
    assert osp.dirname(seen['files_folder']) == root
    assert osp.basename(seen['files_folder']).startswith('.tmp_incident_')
    assert _entries(tmp_path) == ['incident_000_iter000005']
    assert incident_writes == [BATCH_NAME, 'report.md', REPORT_NAME]
    written = load_report(folder)
    assert written['cause'] == 'data'
    assert written['report_path'] == report['report_path']
    assert report['report_path'] == osp.join(folder, REPORT_NAME)


def test_a_failing_fill_keeps_the_record(tmp_path, log_file):
    def fill(files_folder, folder):
        raise RuntimeError('the diagnosis broke')

    _, report, folder = _record(tmp_path, fill=fill)
    assert load_report(folder) == dict(report)
    assert 'cause' not in report
    assert (
        f'completing the incident report of {folder} failed '
        '(RuntimeError: the diagnosis broke)'
    ) in log_file()


def test_mark_discarded(tmp_path):
    root = str(tmp_path / 'nanguard')
    folders = {}
    for iteration in (2, 3, 5):
        _, _, folders[iteration] = _record(tmp_path, iteration=iteration)
    marked = mark_discarded(root, 3)
    assert marked == [folders[3], folders[5]]
    for iteration in (3, 5):
        report = load_report(folders[iteration])
        assert report['discarded_by_resume'] is True
        assert report['resumed_at_iteration'] == 3
        with open(osp.join(folders[iteration], DISCARDED_NAME)) as f:
            assert 'checkpoint of iteration 3' in f.read()
        load_incident(folders[iteration])  # still a readable incident
    assert 'discarded_by_resume' not in load_report(folders[2])
    assert not osp.exists(osp.join(folders[2], DISCARDED_NAME))
    assert mark_discarded(root, 3) == []  # marked once
    assert mark_discarded(str(tmp_path / 'none'), 0) == []


#: Runs one incident write that blocks at ``point`` (after writing a
#: marker file), to be killed there with SIGKILL.
KILL_SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    import torch
    from mmnanguard.engine.incident import IncidentRecorder

    work_dir, marker, point = sys.argv[1:4]

    def block():
        open(marker, 'w').close()
        time.sleep(120)

    class Slow:
        def __reduce__(self):
            block()
            return (int, ())

        def __str__(self):
            block()
            return 'slow'

    report = dict(iteration=7, kind='nonfinite_loss')
    batch = dict(data_batch=dict(x=torch.ones(3)), rng_state={}, iteration=7)
    fill = None
    if point == 'fill':  # the diagnosis, between batch.pth and report.json
        fill = lambda files_folder, folder: block()
    elif point == 'torch.save':
        batch['data_batch']['slow'] = Slow()
    elif point == 'json':
        report['slow'] = Slow()
    else:  # the n-th fsync: batch, report, the folder, its parent
        calls, n, fsync = [0], int(point[len('fsync'):]), os.fsync

        def slow_fsync(fd):
            calls[0] += 1
            if calls[0] == n:
                block()
            fsync(fd)

        os.fsync = slow_fsync
    IncidentRecorder(work_dir, 5, 0, 1).record(report, batch, fill=fill)
    """
)


@pytest.mark.parametrize(
    'point',
    ['torch.save', 'fill', 'json', 'fsync1', 'fsync2', 'fsync3', 'fsync4'],
)
def test_kill_inside_the_incident_write(tmp_path, point):
    """SIGKILL inside the write leaves no incident folder or a complete
    one."""
    work_dir, marker = str(tmp_path / 'work'), str(tmp_path / 'marker')
    proc = subprocess.Popen(
        [sys.executable, '-c', KILL_SCRIPT, work_dir, marker, point]
    )
    try:
        deadline = time.monotonic() + 240
        while not osp.exists(marker):
            assert proc.poll() is None, f'exited with {proc.returncode}'
            assert time.monotonic() < deadline, 'never reached the point'
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    root = osp.join(work_dir, 'nanguard')
    incidents = [n for n in os.listdir(root) if n.startswith('incident_')]
    if point == 'fsync4':  # the folder was renamed; its parent not synced
        assert incidents == ['incident_000_iter000007']
    else:
        assert incidents == []
    for name in incidents:
        report, batch = load_incident(osp.join(root, name))
        assert report['iteration'] == batch['iteration'] == 7
        assert torch.equal(batch['data_batch']['x'], torch.ones(3))
    # the next incident is written whole beside what the kill left
    recorder = IncidentRecorder(work_dir, 5, 0, 1)
    folder = recorder.record(dict(iteration=9, kind='nonfinite_loss'))
    with open(osp.join(folder, REPORT_NAME)) as f:
        assert json.load(f)['iteration'] == 9
