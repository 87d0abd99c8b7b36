# Copyright (c) mmnanguard contributors. All rights reserved.
"""Links planted in a work dir lead nothing outside it to be written.

* ``work_dir/nanguard`` a link to another run's incident folders: a
  ``--resume`` used to walk through it, writing ``DISCARDED`` and
  rewriting ``report.json`` there. The folder is now opened with
  ``O_NOFOLLOW`` and everything below relative to its descriptor.
* ``work_dir/nanguard`` swapped for a link after an incident was recorded,
  to a folder holding an incident folder of the same name: the diagnosis
  wrote ``report.md`` there. The incident folder is now opened relative to
  its root's descriptor, both with ``O_NOFOLLOW``.
* ``work_dir/<config>.py`` a link: mmengine's config dump writes through
  it (shown with the bare ``Runner``); the protected runners replace the
  link by the dump and leave its target alone.
"""

import os
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.runner import Runner
from toy_runs import protected_toy_runner
from tree_snapshot import snapshot_tree

from mmnanguard.engine.incident import (
    DISCARDED_NAME,
    IncidentRecorder,
    UnsafeIncidentFolderError,
    load_report,
    mark_discarded,
    write_incident_file,
)
from mmnanguard.testing.toy import toy_runner_cfg


def _incidents(work_dir, iterations) -> list:
    recorder = IncidentRecorder(str(work_dir), 10, rank=0, world_size=1)
    return [
        recorder.record(
            dict(iteration=it, kind='nonfinite_loss'),
            dict(
                data_batch=dict(inputs=[torch.ones(2)]),
                rng_state={},
                iteration=it,
            ),
        )
        for it in iterations
    ]


def test_mark_discarded_refuses_a_linked_incident_root(tmp_path):
    _incidents(tmp_path / 'other_run', [3, 5])
    work = tmp_path / 'work'
    work.mkdir()
    os.symlink(tmp_path / 'other_run' / 'nanguard', work / 'nanguard')
    before = snapshot_tree(tmp_path / 'other_run')
    assert mark_discarded(str(work / 'nanguard'), 0) == []
    assert snapshot_tree(tmp_path / 'other_run') == before


def test_mark_discarded_leaves_a_linked_incident_folder_alone(tmp_path):
    (outside,) = _incidents(tmp_path / 'other_run', [7])
    own = _incidents(tmp_path / 'work', [2, 4])
    root = tmp_path / 'work' / 'nanguard'
    os.symlink(outside, root / 'incident_009_iter000009')
    before = snapshot_tree(tmp_path / 'other_run')
    assert mark_discarded(str(root), 3) == [own[1]]
    assert snapshot_tree(tmp_path / 'other_run') == before
    assert load_report(own[1])['discarded_by_resume'] is True
    assert osp.isfile(osp.join(own[1], DISCARDED_NAME))
    assert not osp.exists(osp.join(own[0], DISCARDED_NAME))


def test_resume_marks_nothing_through_a_linked_incident_root(tmp_path):
    """The real path: ``NanGuardHook.after_load_checkpoint`` on
    ``--resume``; the run resumes and finishes."""
    work = tmp_path / 'work'
    protected_toy_runner(work, 2).train()
    _incidents(tmp_path / 'other_run', [5])
    os.symlink(tmp_path / 'other_run' / 'nanguard', work / 'nanguard')
    before = snapshot_tree(tmp_path / 'other_run')
    runner = protected_toy_runner(work, 3, resume=True)
    runner.train()
    assert runner.iter == 3
    assert snapshot_tree(tmp_path / 'other_run') == before


def test_diagnosis_writes_nothing_through_a_root_swapped_for_a_link(
    tmp_path,
):
    (own,) = _incidents(tmp_path / 'work', [4])
    root = tmp_path / 'work' / 'nanguard'
    outside = tmp_path / 'outside'
    (outside / osp.basename(own)).mkdir(parents=True)
    os.rename(root, tmp_path / 'work' / 'moved')
    os.symlink(outside, root)
    before = snapshot_tree(outside)
    with pytest.raises(UnsafeIncidentFolderError, match='nanguard'):
        write_incident_file(own, 'report.md', '# report\n')
    assert snapshot_tree(outside) == before


def test_diagnosis_writes_into_a_real_incident_folder(tmp_path):
    (own,) = _incidents(tmp_path / 'work', [4])
    assert write_incident_file(own, 'report.md', '# r\n') == osp.join(
        own, 'report.md'
    )
    assert open(osp.join(own, 'report.md')).read() == '# r\n'
    other = tmp_path / 'copied'  # a folder of any other name: as before
    other.mkdir()
    write_incident_file(str(other), 'report.md', 'x')
    assert (other / 'report.md').read_text() == 'x'


def _config_link(tmp_path):
    work = tmp_path / 'work'
    work.mkdir()
    victim = tmp_path / 'victim.py'
    victim.write_text('keep me\n')
    os.symlink(victim, work / 'toy_cfg.py')
    source = tmp_path / 'configs' / 'toy_cfg.py'
    source.parent.mkdir()
    source.write_text("note = 'dumped'\n")
    return work, victim, Config.fromfile(str(source))


def test_bare_runner_dumps_the_config_through_a_link(tmp_path):
    """The vector is real: mmengine writes through the link."""
    work, victim, cfg = _config_link(tmp_path)
    Runner(**toy_runner_cfg(str(work), cfg=cfg))
    assert "note = 'dumped'" in victim.read_text()


def test_protected_runner_replaces_a_planted_config_link(tmp_path):
    work, victim, cfg = _config_link(tmp_path)
    protected_toy_runner(work, 1, cfg=cfg)
    assert victim.read_text() == 'keep me\n'
    dumped = work / 'toy_cfg.py'
    assert dumped.is_file() and not dumped.is_symlink()
    assert dumped.read_text() == cfg.pretty_text
