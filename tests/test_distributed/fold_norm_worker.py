# Copyright (c) mmnanguard contributors. All rights reserved.
"""One rank of the folded-gradient-norm test (started by torchrun).

mmdet's ResNet-18 sharded by torch's ``fully_shard`` (its stages, then the
whole model), a backward on generated images (different on each rank);
the step guard reads the gradients' norm (folded into its ``all_reduce``)
and the worker gathers the full gradients (``full_tensor``, after the
read) for the test's independent float64 norm. Each case writes what this
rank saw to ``OUT.rank{RANK}.json``.

Usage: ``fold_norm_worker.py OUT``.
"""

import json
import math
import sys

import torch


def _sequence() -> int:
    """Collectives the default group has issued so far (also those a
    DTensor makes inside its dispatch)."""
    from torch.distributed import distributed_c10d

    group = distributed_c10d._get_default_group()
    return group._get_sequence_number_for_group()


def _model():
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules
    from torch.distributed.fsdp import fully_shard

    register_all_modules()
    torch.manual_seed(0)  # the same weights on every rank
    model = MODELS.build(
        dict(type='ResNet', depth=18, out_indices=(3,), init_cfg=None)
    )
    for child in model.children():
        if any(True for _ in child.parameters()):
            fully_shard(child)
    fully_shard(model)
    return model


def _backward(model, rank: int) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    generator = torch.Generator().manual_seed(100 + rank)
    images = torch.rand(2, 3, 32, 32, generator=generator)
    loss = model(images)[-1].float().pow(2).mean()
    loss.backward()
    return loss


def _full_grads(model) -> list:
    """Every gradient gathered, in float64 (a collective per tensor)."""
    return [
        p.grad.full_tensor().double().flatten()
        for p in model.parameters()
        if p.grad is not None
    ]


def _plant(model, value: float) -> None:
    """``value`` into the first element of this rank's shard of the first
    gradient whose shard here is not empty."""
    for p in model.parameters():
        shard = p.grad.to_local()
        if shard.numel():
            shard.view(-1)[0] = value
            return


def _guard(model):
    from mmnanguard.engine.guard.step_guard import StepGuard

    names = {id(p): n for n, p in model.named_parameters()}
    return StepGuard(names)


def _number(x: float):
    return x if math.isfinite(x) else repr(x)


def _read_case(model, rank: int, plant_rank: int, value: float, p: float):
    """One read; ``value`` planted on ``plant_rank`` (-1: none)."""
    _backward(model, rank)
    if rank == plant_rank:
        _plant(model, value)
    guard = _guard(model)
    guard.begin_iteration(0)
    before = _sequence()
    verdict = guard.read(object(), list(model.parameters()), norm_type=p)
    collectives = _sequence() - before
    full = torch.cat(_full_grads(model))
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    # torch's own norm of the sharded gradients (reduced in the DTensor)
    own = torch.nn.utils.get_total_norm(grads, p).full_tensor()
    return dict(
        grad_norm=_number(verdict.grad_norm),
        grad_finite=verdict.grad_finite,
        local_grad_finite=verdict.local_grad_finite,
        allows_step=verdict.allows_step(),
        collectives=collectives,
        reference=_number(torch.linalg.vector_norm(full, p).item()),
        torch_norm=_number(own.item()),
        total_placements=[
            str(x) for x in getattr(verdict.grad_total, 'placements', ())
        ],
    )


def _clip_case(model, rank: int):
    """A guarded SGD step with ``clip_grad``: the parameters after it."""
    from mmnanguard.engine.optimizers.guarded_optim_wrapper import (
        GuardedOptimWrapper,
    )

    lr, max_norm = 0.5, 1e-3
    params = list(model.parameters())
    wrapper = GuardedOptimWrapper(
        torch.optim.SGD(params, lr=lr), clip_grad=dict(max_norm=max_norm)
    )
    wrapper.attach_guard(_guard(model))
    wrapper.nanguard.begin_iteration(0)
    model.zero_grad(set_to_none=True)
    generator = torch.Generator().manual_seed(100 + rank)
    images = torch.rand(2, 3, 32, 32, generator=generator)
    wrapper.backward(model(images)[-1].float().pow(2).mean())
    grads = _full_grads(model)
    weights = [p.full_tensor().double().flatten() for p in params]
    before = _sequence()
    wrapper.step()
    collectives = _sequence() - before
    after = torch.cat([p.full_tensor().double().flatten() for p in params])
    clipped = torch.cat(_full_grads(model))  # clipped in place, not zeroed
    grads, weights = torch.cat(grads), torch.cat(weights)
    norm = torch.linalg.vector_norm(grads).item()
    coef = min(1.0, max_norm / (norm + 1e-6))
    return dict(
        collectives=collectives,
        coef=coef,
        reference=norm,
        # clip_grad's scaling, relative to the largest clipped gradient
        clip_error=(
            (clipped - coef * grads).abs().max() / clipped.abs().max()
        ).item(),
        # the SGD step with the clipped gradients, within the float32
        # rounding of the weights
        step_error=(after - (weights - lr * coef * grads)).abs().max().item(),
        weight_ulp=weights.abs().max().item() * 2**-23,
    )


def _spike_case(model, rank: int, action: str = 'skip'):
    """The same loss three times; the gradients times 100 on the second
    read: a gradient-norm spike (checked after the all_reduce), no loss
    spike; rank 1's loss times 1000 on the third: a loss spike there only,
    which keeps the gradient norm out of the window on every rank."""
    from mmnanguard.engine.guard.spike_detector import SpikeDetector
    from mmnanguard.engine.guard.spike_settings import SpikeSettings

    guard = _guard(model)
    guard.spike_detector = SpikeDetector(
        SpikeSettings(action=action, factor=10.0, window=5, warmup=1)
    )
    owner = object()
    seen = []
    for iteration, scale in enumerate((1.0, 100.0, 1.0)):
        guard.begin_iteration(iteration)
        loss = _backward(model, rank)
        for p in model.parameters():
            p.grad.mul_(scale)
        if iteration == 2 and rank == 1:
            loss = loss * 1000
        guard.note_loss(owner, loss)
        verdict = guard.read(owner, list(model.parameters()))
        full = torch.cat(_full_grads(model))
        seen.append(
            dict(
                grad_norm=verdict.grad_norm,
                reference=torch.linalg.vector_norm(full).item(),
                spikes=[
                    (s.name, s.value, s.reference) for s in verdict.spikes
                ],
                dropped=verdict.guard_drops,
                veto=verdict.veto,
            )
        )
    return dict(reads=seen, windows=guard.spike_detector.windows())


def main(out: str) -> int:
    import torch.distributed as torch_dist

    torch_dist.init_process_group('gloo')
    rank = torch_dist.get_rank()
    model = _model()
    result = dict(
        finite=_read_case(model, rank, -1, 0.0, 2.0),
        finite_p1=_read_case(model, rank, -1, 0.0, 1.0),
        nan_rank1=_read_case(model, rank, 1, math.nan, 2.0),
        inf_rank0=_read_case(model, rank, 0, math.inf, 2.0),
        max_norm=_read_case(model, rank, -1, 0.0, math.inf),
        clip=_clip_case(model, rank),
        spike=_spike_case(model, rank),
        spike_log=_spike_case(model, rank, 'log'),
    )
    with open(f'{out}.rank{rank}.json', 'w') as f:
        json.dump(result, f)
    torch_dist.barrier()
    torch_dist.destroy_process_group()
    return 0


if __name__ == '__main__':
    sys.exit(main(*sys.argv[1:]))
