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

import math
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any, Deque, Dict, List, Optional

import torch

from .spike_settings import SpikeSettings


@dataclass
class Spike:
    """One quantity that spiked.

    Args:
        stage (str): ``'loss'`` (before backward) or ``'grad'``.
        name (str): ``'loss'``, a term such as ``'loss_cls'``, or
            ``'grad_norm'``; ``#i`` is appended for the ``i``-th (>0)
            ``update_params`` of an iteration (``OptimWrapperDict``).
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


class SpikeDetector:
    """Running maxima of the total loss, each loss term and the grad norm.

    Install :meth:`loss_veto` in ``StepGuard.loss_vetoes`` and
    :meth:`grad_veto` in ``StepGuard.grad_vetoes``; call
    :meth:`begin_iteration` at the start of each iteration and read
    :attr:`detections` after it. Under ``action='log'`` the vetoes only
    record and never drop an update.

    Args:
        settings (SpikeSettings): Threshold, window, action.
    """

    def __init__(self, settings: SpikeSettings) -> None:
        self.settings = settings
        self.windows: Dict[str, Deque[float]] = {}
        #: Spikes seen in the current iteration (all stages).
        self.detections: List[Spike] = []
        self._loss_calls = 0
        self._grad_calls = 0

    def begin_iteration(self) -> None:
        """Forget the previous iteration's detections."""
        self.detections = []
        self._loss_calls = 0
        self._grad_calls = 0

    def check(self, stage: str, name: str, value: float) -> Optional[Spike]:
        """Compare ``value`` with the running max of ``name``.

        A non-spike finite value is admitted to the window; a spike and a
        non-finite value (the guard's own business) are not.

        Returns:
            Spike | None: The spike, or None.
        """
        if not math.isfinite(value):
            return None
        s = self.settings
        window = self.windows.setdefault(name, deque(maxlen=s.window))
        if len(window) >= s.warmup:
            reference = max(max(window), s.min_value)
            if reference > 0 and value > s.factor * reference:
                return Spike(stage, name, value, reference, s.factor)
        window.append(value)
        return None

    def loss_veto(self, record, value: float) -> Optional[str]:
        """A ``StepGuard`` loss veto: the total loss and each term."""
        suffix = f'#{self._loss_calls}' if self._loss_calls else ''
        self._loss_calls += 1
        keys = self.settings.keys
        values = dict(loss=value) if keys is None or 'loss' in keys else {}
        values.update(_term_values(record.loss_terms, keys))
        checked = (
            self.check('loss', name + suffix, v) for name, v in values.items()
        )
        return self._verdict([spike for spike in checked if spike])

    def grad_veto(self, record, value: float) -> Optional[str]:
        """A ``StepGuard`` grad veto: the global gradient norm."""
        suffix = f'#{self._grad_calls}' if self._grad_calls else ''
        self._grad_calls += 1
        spike = self.check('grad', 'grad_norm' + suffix, value)
        return self._verdict([spike] if spike else [])

    def _verdict(self, spikes: List[Spike]) -> Optional[str]:
        self.detections.extend(spikes)
        if not spikes or self.settings.action == 'log':
            return None
        return 'spike: ' + ', '.join(s.describe() for s in spikes)

    def describe(self) -> str:
        """The detections of this iteration, for log lines."""
        return ', '.join(s.describe() for s in self.detections)

    def detections_as_dicts(self) -> List[Dict[str, Any]]:
        """The detections of this iteration as JSON-ready dicts."""
        return [asdict(s) for s in self.detections]

    def state_dict(self) -> Dict[str, Any]:
        """The windows, so that a resumed run keeps its statistics."""
        return dict(windows={k: list(v) for k, v in self.windows.items()})

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.windows = {
            k: deque((float(x) for x in v), maxlen=self.settings.window)
            for k, v in state.get('windows', {}).items()
        }


def _term_values(
    loss_terms: Dict[str, Any], keys: Optional[List[str]]
) -> Dict[str, float]:
    """The scalar loss terms (names containing ``'loss'``, the total
    excluded) as floats, with one host sync for all tensors."""
    names, tensors, values = [], [], {}
    for name, value in (loss_terms or {}).items():
        if (
            name == 'loss'
            or (keys is None and 'loss' not in name)
            or (keys is not None and name not in keys)
        ):
            continue
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            names.append(name)
            tensors.append(value.detach().reshape(()).float())
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            values[name] = float(value)
    if tensors:
        values.update(zip(names, torch.stack(tensors).tolist()))
    return values
