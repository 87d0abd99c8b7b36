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
workers); and once with SIGTERM in the middle of the epoch instead.
"""

import pytest
from exact_resume_runs import differing_tensors, resume_config, train

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
