# Copyright (c) mmnanguard contributors. All rights reserved.
"""Loss and gradient-norm spikes against a running max.

Why a multiple of a running max (Megatron-LM's
``RerunStateMachine.is_unexpectedly_large``, used by
``--check-for-spiky-loss`` with a threshold of 10x the max of the values
observed) and not a z-score over a window (OLMo-core's stability monitor):

* Per-batch detection losses are heavy-tailed: with a few images per
  batch, a batch with many or hard objects sits several standard
  deviations above the window mean (the toy model's ``loss_a`` alone spans
  two orders of magnitude between batches). A z-score threshold low
  enough to catch real spikes fires on such healthy batches; the running
  max already contains them.
* It needs no variance estimate: over a window of near-constant values a
  z-score divides by a standard deviation near 0 and flags noise.
* It is scale free and has one intuitive knob (``factor``): a value
  ``factor`` times above anything the quantity did in the last ``window``
  accepted iterations.

The price: the bar is the highest recent value, so moderate jumps, and a
large jump of a term that happens to be small in that batch (100 x 0.02
against a running max of 4), stay below it. A shorter ``window`` makes the
bar follow the loss down faster. The non-finite checks and the AMP monitor
cover what such a missed spike may lead to.

Values that are spikes are not admitted to the window (a spike must not
raise the bar for the next one); a lasting level shift is therefore handled
by the guard's escalation (``max_consecutive_skips``), not silently learnt.
"""

from dataclasses import asdict, dataclass
from typing import Any, Dict, List, NamedTuple, Optional

import torch
from torch import Tensor

from .spike_settings import SpikeSettings
from .state_checks import numbers_at, state_dict_at


@dataclass
class Spike:
    """One quantity that spiked.

    Args:
        stage (str): ``'loss'`` (a loss term or the total) or ``'grad'``.
        name (str): ``'loss'``, a term such as ``'loss_cls'``, or
            ``'grad_norm'``; ``#i`` is appended for the ``i``-th (>0)
            optimizer step of an iteration (``OptimWrapperDict``).
        value (float): The value seen.
        reference (float): The running max it was compared with.
        factor (float): The threshold multiple.
    """

    stage: str
    name: str
    value: float
    reference: float
    factor: float

    def describe(self) -> str:
        """``loss_cls=113 > 10 x running max 1.13``."""
        return (
            f'{self.name}={self.value:.4g} > {self.factor:g} x running '
            f'max {self.reference:.4g}'
        )


@dataclass
class SpikeCheck:
    """One step's spike check, still on the device.

    Args:
        names (list[str]): The quantities, in order.
        flags (Tensor): 1 where the quantity spiked.
        values (Tensor): The values checked.
        references (Tensor): The running max each was compared with.
    """

    names: List[str]
    flags: Tensor
    values: Tensor
    references: Tensor

    def merged(self, later: 'SpikeCheck', grad_name: str) -> 'SpikeCheck':
        """This check of the losses joined with ``later``'s check of the
        gradient norm ``grad_name``, each with the other's rows unchecked
        (device operations only: no copy from the host)."""
        row = later.names.index(grad_name)
        values, refs = self.values.clone(), self.references.clone()
        values[row] = later.values[row]
        refs[row] = later.references[row]
        return SpikeCheck(
            names=later.names,
            flags=self.flags | later.flags,
            values=values,
            references=refs,
        )

    def spikes(
        self,
        flags: List[float],
        values: List[float],
        refs: List[float],
        factor: float,
    ) -> List[Spike]:
        """The spikes, from the host copies of the three vectors."""
        return [
            Spike(
                'grad' if name.startswith('grad_norm') else 'loss',
                name,
                value,
                ref,
                factor,
            )
            for name, flag, value, ref in zip(self.names, flags, values, refs)
            if flag
        ]


class _Rows(NamedTuple):
    """The detector's state on the device, one row per quantity."""

    window: Tensor  # [quantities, window]
    admitted: Tensor  # admitted values per row
    grad: Tensor  # whether the row is a gradient norm's


class SpikeDetector:
    """Running maxima of the total loss, each loss term and the grad norm,
    kept on the device.

    :meth:`check` compares one step's values with the maxima of the last
    ``window`` admitted values of each quantity and admits the finite
    values that are not spikes (the grad norm only when no loss quantity
    spiked in the same step), all as tensor operations: nothing is read on
    the host. The step guard reads the result in its one read per step.

    Args:
        settings (SpikeSettings): Threshold, window, action.
    """

    def __init__(self, settings: SpikeSettings) -> None:
        self.settings = settings
        #: The quantities, one row each of the window.
        self.names: List[str] = []
        self._rows: Optional[_Rows] = None
        self._loaded: Dict[str, List[float]] = {}

    @property
    def acts(self) -> bool:
        """Whether a spike drops the update (``action`` is not ``log``)."""
        return self.settings.action != 'log'

    def loss_values(
        self, total: Optional[Tensor], terms: Dict[str, Any], suffix: str
    ) -> Dict[str, Tensor]:
        """The loss quantities this detector checks, as 0-dim tensors.

        Args:
            total (Tensor, optional): The total loss.
            terms (dict): ``log_vars`` of ``parse_losses``.
            suffix (str): ``''`` or ``'#i'`` for the i-th step.
        """
        keys = self.settings.keys
        values: Dict[str, Tensor] = {}
        if total is not None and (keys is None or 'loss' in keys):
            values['loss' + suffix] = total
        for name, value in terms.items():
            if name == 'loss' or not isinstance(value, Tensor):
                continue
            if value.numel() != 1:
                continue
            if (keys is None and 'loss' in name) or (
                keys is not None and name in keys
            ):
                values[name + suffix] = value
        return values

    def check(
        self,
        values: Dict[str, Tensor],
        grad_norm: Optional[Tensor] = None,
        suffix: str = '',
        loss_spiked: Optional[Tensor] = None,
    ) -> Optional[SpikeCheck]:
        """Compare one step's values with the running maxima, on the device.

        Args:
            values (dict): Loss quantities (:meth:`loss_values`).
            grad_norm (Tensor, optional): The global gradient norm, when it
                is checked.
            suffix (str): Appended to ``'grad_norm'`` (see :class:`Spike`).
            loss_spiked (Tensor, optional): Whether a loss quantity of this
                step spiked in an earlier call (the loss values checked
                before the gradient norm was known): the gradient norm is
                then not admitted either.

        Returns:
            SpikeCheck | None: None when there is nothing to check.
        """
        if grad_norm is not None and self.settings.grad_norm:
            values = dict(values)
            values['grad_norm' + suffix] = grad_norm
        if not values:
            return None
        device = next(iter(values.values())).device
        rows = self._add_rows(list(values), device)
        missing = torch.full((), float('nan'), device=device)
        vals = torch.stack(
            [
                values[n].detach().reshape(()).float()
                if n in values
                else missing
                for n in self.names
            ]
        )
        s = self.settings
        ref = rows.window.amax(dim=1).clamp_min(s.min_value)
        finite = torch.isfinite(vals)
        spike = (
            (rows.admitted >= s.warmup)
            & (ref > 0)
            & (vals > s.factor * ref)
            & finite
        )
        admit = finite & ~spike
        grad_rows = rows.grad
        any_loss = (spike & ~grad_rows).any()
        if loss_spiked is not None:
            any_loss = any_loss | loss_spiked.to(any_loss.device)
        admit = admit & ~(grad_rows & any_loss)
        shifted = torch.cat([rows.window[:, 1:], vals[:, None]], dim=1)
        self._rows = _Rows(
            torch.where(admit[:, None], shifted, rows.window),
            rows.admitted + admit.long(),
            rows.grad,
        )
        return SpikeCheck(
            names=list(self.names),
            flags=spike,
            values=vals,
            references=ref,
        )

    def _add_rows(self, names: List[str], device: torch.device) -> _Rows:
        new = [n for n in names if n not in self.names]
        if self._rows is not None and not new:
            return self._rows
        width = self.settings.window
        rows = []
        counts = []
        for name in new:
            kept = self._loaded.pop(name, [])[-width:]
            row = [float('-inf')] * (width - len(kept)) + kept
            rows.append(row)
            counts.append(len(kept))
        added = torch.tensor(rows, device=device, dtype=torch.float32)
        added = added.reshape(len(new), width)
        added_count = torch.tensor(counts, device=device, dtype=torch.long)
        if self._rows is None:
            window, count = added, added_count
        else:
            window = torch.cat([self._rows.window, added])
            count = torch.cat([self._rows.admitted, added_count])
        self.names += new
        grad_rows = torch.tensor(
            [n.startswith('grad_norm') for n in self.names], device=device
        )
        self._rows = _Rows(window, count, grad_rows)
        return self._rows

    def state_dict(self) -> Dict[str, Any]:
        """The admitted values per quantity, so that a resumed run keeps
        its statistics (read on the host: only when a checkpoint is
        written)."""
        windows = dict(self._loaded)
        if self._rows is not None:
            for name, row in zip(self.names, self._rows.window.tolist()):
                windows[name] = [x for x in row if x != float('-inf')]
        return dict(windows=windows)

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (put on the device at the next
        check), every value a finite number.

        Raises:
            GuardStateError: A window is not a list of finite numbers
                (nothing is taken).
        """
        state = state_dict_at(state, 'spike')
        windows = state_dict_at(state.get('windows', {}), 'spike.windows')
        loaded = {
            name: numbers_at(values, f'spike.windows.{name}')
            for name, values in windows.items()
        }
        self.names, self._rows = [], None
        self._loaded = loaded

    def windows(self) -> Dict[str, List[float]]:
        """The admitted values per quantity, oldest first (a host read)."""
        return self.state_dict()['windows']


def spikes_as_dicts(spikes: List[Spike]) -> List[Dict[str, Any]]:
    """The spikes as JSON-ready dicts."""
    return [asdict(s) for s in spikes]
