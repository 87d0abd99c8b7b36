# Copyright (c) mmnanguard contributors. All rights reserved.
"""``AgreedFlags``: the summed vector of the guard's one ``all_reduce``
read by name, on a tensor and on the host list alike.

The two-rank sums themselves are checked in
``tests/test_distributed/test_folded_grad_norm.py`` and
``tests/test_engine/test_hooks/test_nanguard_ddp.py``.
"""

import pytest
import torch

from mmnanguard.engine.guard.agreed_flags import AgreedFlags


def _sent(votes, share):
    head = AgreedFlags(
        loss=1.0, grad=0.0, params=2.0, buffers=3.0, spike=0.0, amp_inf=1.0
    )
    return head.to_list() + list(votes) + list(share)


@pytest.mark.parametrize('votes', [[], [1.0], [0.0, 2.0, 1.0]])
@pytest.mark.parametrize('share', [[], [7.5]])
@pytest.mark.parametrize('as_tensor', [False, True])
def test_view_votes_and_tail_by_name(votes, share, as_tensor):
    summed = _sent(votes, share)
    if as_tensor:
        summed = torch.tensor(summed, dtype=torch.float64)
    seen = AgreedFlags.view(summed)
    assert [float(v) for v in seen] == [1.0, 0.0, 2.0, 3.0, 0.0, 1.0]
    assert (float(seen.loss), float(seen.params)) == (1.0, 2.0)
    assert float(seen.buffers) == 3.0
    assert float(seen.spike) == 0.0 and float(seen.amp_inf) == 1.0
    assert [float(v) for v in AgreedFlags.votes(summed, len(votes))] == votes
    assert [float(v) for v in AgreedFlags.tail(summed, len(votes))] == share


def test_the_head_is_the_six_flags_sent_first():
    assert AgreedFlags._fields == (
        'loss',
        'grad',
        'params',
        'buffers',
        'spike',
        'amp_inf',
    )
