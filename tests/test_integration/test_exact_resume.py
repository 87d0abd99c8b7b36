# Copyright (c) mmnanguard contributors. All rights reserved.
"""A protected run stopped right after a mid-epoch checkpoint and resumed
ends with the uninterrupted run's weights, every tensor ``torch.equal``,
after training the same batches with the same flips; bare mmengine's
resume of the same run does not.

The tiny rotated RetinaNet (upstream mmrotate config, shrunk; shuffled
``DefaultSampler``, ``RandomFlip``), 8 generated images in batches of 2:
2 epochs of 4 iterations, a checkpoint after every iteration, stopped
after iteration 6 (the middle of epoch 2), for an epoch-based loop and an
``IterBasedTrainLoop`` over the same finite sampler (which passes the end
of an epoch after the resume), with ``num_workers`` 0 and 2 (persistent
workers); once with SIGTERM in the middle of the epoch instead; and with
``policy='rollback'`` and NaN gradients rolled back before the stop and
after the resume.
"""

from typing import List

import pytest
from exact_resume_runs import differing_tensors, resume_config, train

from mmnanguard.engine.runner.checkpoint_agreement import guard_hook

STOP_AT = 6


@pytest.mark.slow
@pytest.mark.parametrize('num_workers', [0, 2])
@pytest.mark.parametrize('loop', ['epoch', 'iter'])
def test_resume_is_bit_identical(loop, num_workers, tiny_dota_root, tmp_path):
    def config(name):
        return resume_config(
            str(tmp_path / name), tiny_dota_root, loop, num_workers
        )

    whole, seen_whole = train(config('whole'))
    _, seen_before = train(config('broken'), stop_at=STOP_AT)
    resumed, seen_after = train(config('broken'), resume=True)

    assert [b[0] for b in seen_whole] == list(range(8))
    assert seen_before == seen_whole[:STOP_AT]
    # the same batches, batch indices and flips after the resume
    assert seen_after == seen_whole[STOP_AT:]
    assert resumed.iter == whole.iter == 8
    assert (
        differing_tensors(whole.model.state_dict(), resumed.model.state_dict())
        == []
    )
    optim_whole = whole.optim_wrapper.state_dict()['state']
    optim_resumed = resumed.optim_wrapper.state_dict()['state']
    for key in optim_whole:
        assert differing_tensors(optim_whole[key], optim_resumed[key]) == []


@pytest.mark.slow
def test_sigterm_mid_epoch_then_resume_is_bit_identical(
    tiny_dota_root, tmp_path
):
    """SIGTERM during iteration 6 of the epoch-based run with 2 workers:
    the preemption checkpoint ``iter_6.pth`` (no periodic checkpoint in
    this run), then the resume, as after the kill above."""

    def config(name):
        cfg = resume_config(str(tmp_path / name), tiny_dota_root, 'epoch', 2)
        cfg.default_hooks.checkpoint.interval = 100
        return cfg

    whole, seen_whole = train(config('whole'))
    _, seen_before = train(config('broken'), stop_at=STOP_AT, how='sigterm')
    assert (tmp_path / 'broken' / f'iter_{STOP_AT}.pth').is_file()
    resumed, seen_after = train(config('broken'), resume=True)
    assert seen_before == seen_whole[:STOP_AT]
    assert seen_after == seen_whole[STOP_AT:]
    assert (
        differing_tensors(whole.model.state_dict(), resumed.model.state_dict())
        == []
    )


@pytest.mark.slow
def test_bare_mmengine_repeats_the_interrupted_epoch(tiny_dota_root, tmp_path):
    """The same stop and resume under bare mmengine (no include): the first
    two batches of epoch 2 are trained again, the run ends two iterations
    late, and the weights differ: the comparison above can fail."""

    def config(name):
        return resume_config(
            str(tmp_path / name), tiny_dota_root, 'epoch', 0, protected=False
        )

    whole, seen_whole = train(config('whole'))
    _, seen_before = train(config('broken'), stop_at=STOP_AT)
    resumed, seen_after = train(config('broken'), resume=True)

    assert seen_before == seen_whole[:STOP_AT]
    files_after = [b[2] for b in seen_after]
    # epoch 2 again from its first batch: batches 5 and 6 a second time
    assert files_after == [b[2] for b in seen_whole[4:]]
    assert resumed.iter == 10 and whole.iter == 8
    assert differing_tensors(
        whole.model.state_dict(), resumed.model.state_dict()
    )


def _incidents(work_dir) -> List[str]:
    """The incident folders of a run, by name."""
    return sorted(p.name for p in (work_dir / 'nanguard').glob('incident_*'))


@pytest.mark.slow
@pytest.mark.parametrize(
    'source, faults, exact',
    [
        ('memory', (2,), True),
        ('checkpoint', (2, 6), True),
        ('memory', (2, 6), False),
    ],
    ids=['memory-before', 'checkpoint-both', 'memory-both'],
)
def test_resume_of_a_rolled_back_run(
    source, faults, exact, tiny_dota_root, tmp_path
):
    """``policy='rollback'``: a NaN gradient at iteration 3 is rolled back
    (the lrs backed off), the run is stopped after iteration 6 and resumed;
    with a second fault, a NaN gradient at iteration 7 is rolled back in
    the resumed run. The guard's counters, lr multiplier and incident
    folders continue (the second incident is ``incident_001`` in both
    runs). Every weight and optimizer tensor and the lr of every parameter
    group are those of the uninterrupted run, except after an in-memory
    rollback in the resumed run: the interrupted run's in-memory snapshots
    are not in the checkpoint, so it restores the state it resumed from,
    saved after the schedule's step of iteration 6, where the uninterrupted
    run's snapshot was taken before it (one warm-up step apart)."""
    import mmnanguard.testing  # noqa: F401  (FaultInjectionHook)

    def config(name):
        cfg = resume_config(str(tmp_path / name), tiny_dota_root, 'epoch', 0)
        cfg.nanguard.update(
            policy='rollback', snapshot_interval=2, rollback_source=source
        )
        cfg.custom_hooks = [
            dict(type='FaultInjectionHook', fault='nan_grad', iteration=i)
            for i in faults
        ]
        return cfg

    whole, seen_whole = train(config('whole'))
    _, seen_before = train(config('broken'), stop_at=STOP_AT)
    resumed, seen_after = train(config('broken'), resume=True)

    assert seen_before + seen_after == seen_whole
    guard_whole, guard_resumed = guard_hook(whole), guard_hook(resumed)
    assert guard_whole.counters['rollbacks'] == len(faults)
    assert guard_resumed.counters == guard_whole.counters
    assert (
        guard_resumed.responder.lr_backoff.state_dict()
        == guard_whole.responder.lr_backoff.state_dict()
    )
    names = _incidents(tmp_path / 'whole')
    assert len(names) == len(faults)
    assert names[-1].startswith(f'incident_{len(faults) - 1:03d}_')
    assert _incidents(tmp_path / 'broken') == names
    lrs_whole = [g['lr'] for g in whole.optim_wrapper.param_groups]
    lrs_resumed = [g['lr'] for g in resumed.optim_wrapper.param_groups]
    differ = differing_tensors(
        whole.model.state_dict(), resumed.model.state_dict()
    )
    if not exact:
        assert lrs_resumed != lrs_whole and differ
        return
    assert lrs_resumed == lrs_whole
    assert differ == []
    optim_whole = whole.optim_wrapper.state_dict()['state']
    optim_resumed = resumed.optim_wrapper.state_dict()['state']
    for key in optim_whole:
        assert differing_tensors(optim_whole[key], optim_resumed[key]) == []
