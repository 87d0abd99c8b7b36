# Copyright (c) mmnanguard contributors. All rights reserved.
"""The gradient norm of sharded gradients, folded into the verdict's
``all_reduce`` (``mmnanguard/engine/guard/grad_norm.py``), 2 gloo
processes, mmdet's ResNet-18 sharded by torch's ``fully_shard``
(``fold_norm_worker.py``).

Each rank's read must give the norm of the full (unsharded) gradients,
which the worker gathers after the read and the test compares in float64;
a NaN or an inf in one rank's shard must make the norm non-finite on every
rank; the read makes one collective (the ``all_reduce``), a guarded SGD
step with ``clip_grad`` too (the clip scales the sharded gradients with
the folded norm, a replicated DTensor: no communication).
"""

import json
import os.path as osp

import pytest
from integration_utils import run_script

from mmnanguard.testing.distributed import free_port, torchrun_args

HERE = osp.dirname(osp.abspath(__file__))

pytestmark = pytest.mark.slow

#: Float32 gradients: each shard's norm accumulates in float32 (torch's
#: ``_foreach_norm``, as in ``clip_grad_norm_``); a shard counted twice or
#: missed is off by far more.
RTOL = 1e-4


@pytest.fixture(scope='module')
def ranks(tmp_path_factory):
    out = str(tmp_path_factory.mktemp('fold') / 'result')
    proc = run_script(
        torchrun_args(2, free_port())
        + [osp.join(HERE, 'fold_norm_worker.py'), out],
        timeout=300,
        env=dict(OMP_NUM_THREADS='1'),
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    return [json.load(open(f'{out}.rank{r}.json')) for r in (0, 1)]


@pytest.mark.parametrize('case', ['finite', 'finite_p1'])
def test_folded_norm_is_the_full_gradients_norm(ranks, case):
    for rank in ranks:
        seen = rank[case]
        assert seen['grad_norm'] == pytest.approx(seen['reference'], rel=RTOL)
        # torch's own norm of the same shards (reduced inside the DTensor)
        assert seen['grad_norm'] == pytest.approx(seen['torch_norm'], rel=1e-5)
        assert seen['grad_finite'] and seen['allows_step']
        assert seen['collectives'] == 1  # the verdict's all_reduce only
        assert seen['total_placements'] == ['R']  # what clip_grad is given
    # every rank holds the same bits
    assert ranks[0][case]['grad_norm'] == ranks[1][case]['grad_norm']


@pytest.mark.parametrize(
    'case, planted_on, value',
    [('nan_rank1', 1, 'nan'), ('inf_rank0', 0, 'inf')],
)
def test_nonfinite_shard_on_one_rank_is_seen_by_every_rank(
    ranks, case, planted_on, value
):
    for number, rank in enumerate(ranks):
        seen = rank[case]
        assert seen['reference'] == value  # the full gradients, float64
        assert seen['grad_norm'] == value
        assert not seen['grad_finite'] and not seen['allows_step']
        # which rank's shards held it, from the same read
        assert seen['local_grad_finite'] is (number != planted_on)
        assert seen['collectives'] == 1


def test_max_norm_keeps_the_dtensor_reduction(ranks):
    # norm_type=inf is a max, which the summing all_reduce cannot carry:
    # the DTensor norm's own collective, then the verdict's
    for rank in ranks:
        seen = rank['max_norm']
        assert seen['grad_norm'] == seen['reference']  # a max is exact
        assert seen['collectives'] == 2


def test_clip_grad_scales_sharded_grads_with_the_folded_norm(ranks):
    for rank in ranks:
        seen = rank['clip']
        assert seen['coef'] < 1e-3  # clipping is active
        assert seen['clip_error'] < 1e-5
        assert seen['step_error'] <= seen['weight_ulp']
        # read, clip and SGD step: the verdict's all_reduce only
        assert seen['collectives'] == 1


def test_grad_norm_spike_after_the_all_reduce(ranks):
    spikes = []
    for rank in ranks:
        first, second, _ = rank['spike']['reads']
        assert first['spikes'] == [] and not first['dropped']
        assert second['grad_norm'] == pytest.approx(
            second['reference'], rel=RTOL
        )
        ((name, value, reference),) = second['spikes']
        assert name == 'grad_norm'
        assert value == second['grad_norm']
        assert reference == first['grad_norm']  # the running max
        assert value > 10 * reference and second['dropped']
        spikes.append(second['spikes'])
    assert spikes[0] == spikes[1]


def test_loss_spike_on_one_rank_keeps_grad_windows_equal(ranks):
    # the third read: a loss spike on rank 1 only, agreed by the vote; the
    # gradient norm (checked after the all_reduce) is admitted on no rank,
    # so both ranks keep the same window: the first read's norm only (the
    # second was a spike)
    third = [rank['spike']['reads'][2] for rank in ranks]
    assert [r['spikes'][0][0] for r in third[1:]] == ['loss']
    assert third[0]['spikes'] == []
    assert third[0]['veto'] == 'a spike on another rank'
    assert third[0]['dropped'] and third[1]['dropped']
    for rank in ranks:
        first = rank['spike']['reads'][0]
        assert rank['spike']['windows']['grad_norm'] == [first['grad_norm']]


def test_logged_loss_spike_on_one_rank_drops_no_rank(ranks):
    # action='log': the rank that saw the spike steps, so the others must
    # too (a veto on them alone would leave the ranks' weights apart)
    third = [rank['spike_log']['reads'][2] for rank in ranks]
    assert [r['spikes'][0][0] for r in third[1:]] == ['loss']
    assert third[0]['spikes'] == [] and third[0]['veto'] is None
    assert not third[0]['dropped'] and not third[1]['dropped']
