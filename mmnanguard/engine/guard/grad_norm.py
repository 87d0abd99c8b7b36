# Copyright (c) mmnanguard contributors. All rights reserved.
"""The global gradient norm of a step, for the guard's single read.

Plain gradients (one process, DDP): computed as torch's ``clip_grad_norm_``
computes it (same dtype, same order), so that clipping with it changes no
bit of training.

Sharded gradients (FSDP2: every gradient a DTensor whose placements are
all ``Shard`` on one mesh that spans every rank, so that each element lives
on exactly one rank) and a finite ``norm_type`` p: the norm is *folded*
into the verdict's ``all_reduce``. Each rank computes, with no collective,
its contribution ``sum(|g| ** p)`` over its shards (from the per-parameter
norms of its shards, in float64); the verdict's ``all_reduce`` (a sum, made
anyway) adds the ranks' contributions; the global norm is the sum
``** (1 / p)``, taken on the device from the reduced vector before the host
read, in the gradients' dtype, and given to ``clip_grad`` as a replicated
DTensor on the gradients' mesh (``DTensor.from_local``: no communication).
A NaN or inf in any rank's shard makes the sum, and so the norm, non-finite
on every rank.

Not folded (the DTensor norm, whose reduction is a collective inside
DTensor's dispatch, as in ``clip_grad_norm_``): ``norm_type=inf`` (a max,
which a sum cannot carry), ``p`` so large that the p-th power of a norm
could overflow float64 (``p * log(max of the dtype) >= log(max of
float64)``: ``p >= 8`` for float32 gradients), a float32-only device (MPS),
a mix of DTensor and plain gradients, a mesh that does not span every rank,
and a ``Replicate`` or ``Partial`` placement (tensor parallel, HSDP).
"""

import math
from dataclasses import dataclass
from typing import Any, List, Optional

import torch
from mmengine import dist
from torch import Tensor

from .dtensor import global_value, is_dtensor, local

try:
    from torch.distributed.tensor import DTensor, Replicate, Shard
except ImportError:  # pragma: no cover (torch < 2.4)
    # the classes or None
    DTensor = Replicate = Shard = None  # type: ignore[assignment,misc]

_LOG_MAX_FLOAT64 = math.log(torch.finfo(torch.float64).max)


@dataclass
class GradNorm:
    """One step's gradient norm, as far as it is known before the read.

    Args:
        norms (Tensor): The norm of each gradient (this rank's shards).
        total (Tensor, optional): The global norm; None while it is folded
            (known after the ``all_reduce``, :meth:`unfold`).
        power (Tensor, optional): When folded: this rank's ``sum(|g| **
            p)`` (float64, shape ``(1,)``), to be summed over the ranks.
        norm_type (float): p.
        mesh (DeviceMesh, optional): When folded: the gradients' mesh.
    """

    norms: Tensor
    total: Optional[Tensor]
    power: Optional[Tensor] = None
    norm_type: float = 2.0
    mesh: Any = None

    @property
    def folded(self) -> bool:
        """Whether the total waits for the verdict's ``all_reduce``."""
        return self.power is not None

    def unfold(self, summed: Tensor) -> Tensor:
        """The global norm from the ranks' summed ``power`` (a device
        tensor; no communication, no host read).

        Args:
            summed (Tensor): ``power`` after the ``all_reduce``.

        Returns:
            Tensor: A replicated 0-dim DTensor on the gradients' mesh, in
            the gradients' dtype (what ``clip_grads_with_norm_`` scales the
            sharded gradients with).
        """
        total = summed.reshape(()) ** (1.0 / self.norm_type)
        total = total.to(self.norms.dtype)
        replicated = [Replicate()] * self.mesh.ndim
        return DTensor.from_local(
            total, self.mesh, replicated, run_check=False
        )


def grad_norm(grads: List[Tensor], norm_type: float, dtype) -> GradNorm:
    """The gradient norm of ``grads`` (non-empty), folded when it can be.

    Args:
        grads (list[Tensor]): The gradients.
        norm_type (float): p of the p-norm.
        dtype (torch.dtype): The dtype of the verdict's ``all_reduce``
            (float64 where the device has it).

    Returns:
        GradNorm: The per-gradient norms and the total or, folded, this
        rank's contribution to it.
    """
    mesh = _fold_mesh(grads, norm_type, dtype)
    if mesh is None:
        # as torch's clip_grad_norm_ computes it (same dtype, same order)
        norms = _per_grad_norms(grads, norm_type)
        total = torch.linalg.vector_norm(norms, norm_type)
        # sharded gradients: the total is replicated (reduced inside the
        # norm); the per-parameter norms name this rank's shards
        return GradNorm(local(norms), global_value(total), norm_type=norm_type)
    norms = _per_grad_norms([local(g) for g in grads], norm_type)
    power = (norms.to(torch.float64) ** norm_type).sum().reshape(1)
    return GradNorm(norms, None, power, norm_type, mesh)


def _per_grad_norms(grads: List[Tensor], norm_type: float) -> Tensor:
    """The norm of each gradient, stacked on the first one's device."""
    per_grad = torch._foreach_norm(grads, norm_type)
    first = per_grad[0].device
    return torch.stack([n.to(first) for n in per_grad])


def _fold_mesh(grads: List[Tensor], norm_type: float, dtype) -> Any:
    """The mesh of ``grads`` when their norm can be folded, else None."""
    if dtype != torch.float64 or dist.get_world_size() < 2:
        return None
    dtensors = [g for g in grads if is_dtensor(g)]
    if not 0 < norm_type < math.inf or len(dtensors) < len(grads):
        return None
    dtypes = {g.dtype for g in grads}
    largest = max(math.log(torch.finfo(t).max) for t in dtypes)
    if norm_type * largest >= _LOG_MAX_FLOAT64:
        return None
    mesh = dtensors[0].device_mesh
    if mesh.size() != dist.get_world_size():
        return None
    for g in dtensors:
        if g.device_mesh is not mesh and g.device_mesh != mesh:
            return None
        if not all(isinstance(p, Shard) for p in g.placements):
            return None
    return mesh
