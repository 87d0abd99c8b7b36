# Copyright (c) mmnanguard contributors. All rights reserved.
"""The buffers a training forward writes (BatchNorm running statistics):
saved before the forward, checked with the step's read, restored when the
forward made them non-finite.

A skip drops the optimizer's update, but BatchNorm writes its running mean
and variance during the forward, before any verdict: a batch whose pixels
are finite but huge (GDAL's NoData value -3.4e38 in a float32 tile)
overflows ``running_var`` to inf while the loss stays finite. The guard
therefore copies the buffers before the forward of each accumulation
window (one ``torch.cat`` into a kept flat copy per device and dtype, no
host read), checks the floating ones in the step's one read, and puts the
copy back when they came out non-finite, so that a skipped step leaves the
model as it was.
"""

from typing import Dict, Iterable, List, Optional, Tuple

import torch
from torch import Tensor

from .finite import any_nonfinite

Group = Tuple[torch.device, torch.dtype]


def nonfinite_buffers(named: Iterable[Tuple[str, Tensor]]) -> List[str]:
    """The names of the non-finite floating buffers of ``named`` (one host
    read per buffer: for an incident or a replay only)."""
    return [
        name
        for name, buffer in named
        if buffer.is_floating_point()
        and not bool(torch.isfinite(buffer).all())
    ]


class ForwardBuffers:
    """Save, check and restore a model's buffers around its forward.

    Args:
        named (dict): ``name -> buffer`` (``model.named_buffers()``); every
            buffer is saved and restored, the floating ones are checked.
    """

    def __init__(self, named: Dict[str, Tensor]) -> None:
        self.names = list(named)
        self.buffers = [named[n] for n in self.names]
        #: The buffers the check reads.
        self.floating = [b for b in self.buffers if b.is_floating_point()]
        self._groups: Dict[Group, List[int]] = {}
        for index, buffer in enumerate(self.buffers):
            key = (buffer.device, buffer.dtype)
            self._groups.setdefault(key, []).append(index)
        # flat views, made once: the forward writes the buffers in place
        # (a non-contiguous buffer is flattened, a copy, at each save)
        self._flat = {
            key: [
                self.buffers[i].view(-1)
                if self.buffers[i].is_contiguous()
                else self.buffers[i]
                for i in indices
            ]
            for key, indices in self._groups.items()
        }
        self._saved: Dict[Group, Tensor] = {}

    @torch.no_grad()
    def save(self) -> None:
        """Copy every buffer (before a forward); no host read."""
        for key, flat in self._flat.items():
            if any(f.dim() != 1 for f in flat):
                flat = [f.reshape(-1) for f in flat]
            saved = self._saved.get(key)
            if saved is None:
                self._saved[key] = torch.cat(flat)
            else:
                torch.cat(flat, out=saved)

    def flag(self) -> Optional[Tensor]:
        """Whether a floating buffer is non-finite now, as a 0-dim bool
        tensor on the device (no host read); None without such buffers."""
        floating = self.floating
        return any_nonfinite(floating) if floating else None

    def nonfinite(self) -> List[str]:
        """The names of the non-finite floating buffers (one host read per
        buffer: for an incident only)."""
        return nonfinite_buffers(zip(self.names, self.buffers))

    @torch.no_grad()
    def restore(self) -> List[str]:
        """Put back the values :meth:`save` copied.

        Returns:
            list[str]: The names of the buffers that were non-finite
            (empty, and nothing restored, when nothing was saved).
        """
        if not self._saved:
            return []
        bad = self.nonfinite()
        for key, indices in self._groups.items():
            start = 0
            saved = self._saved[key]
            for i in indices:
                buffer = self.buffers[i]
                count = buffer.numel()
                buffer.copy_(saved[start : start + count].view_as(buffer))
                start += count
        return bad
