# Copyright (c) mmnanguard contributors. All rights reserved.
"""Multiply one loss term at chosen iterations (loss-spike tests)."""

from typing import Iterable, List

from mmengine.hooks import Hook

from mmnanguard.engine.guard.snapshot import unwrap_model


class LossSpikeInjectionHook(Hook):
    """Multiply the loss term ``loss_key`` by ``factor`` at ``iterations``.

    A forward hook on the model scales the term in the loss dict (each
    element of a per-level list too), so ``parse_losses`` and backward see
    a real spike: the total, the term and its gradients.

    Args:
        iterations (Iterable[int]): 0-based iterations.
        loss_key (str): e.g. ``'loss_cls'``.
        factor (float): Multiplier. Defaults to 100.
    """

    priority = 'HIGHEST'

    def __init__(
        self, iterations: Iterable[int], loss_key: str, factor: float = 100.0
    ) -> None:
        self.iterations = set(iterations)
        self.loss_key = loss_key
        self.factor = factor
        self.injected_at: List[int] = []
        self._handle = None

    def before_train_iter(
        self, runner, batch_idx: int, data_batch=None
    ) -> None:
        """Plant the forward hook for a chosen iteration."""
        if runner.iter in self.iterations:
            self.injected_at.append(runner.iter)
            self._handle = unwrap_model(runner.model).register_forward_hook(
                self._scale
            )

    def after_train_iter(
        self, runner, batch_idx: int, data_batch=None, outputs=None
    ) -> None:
        """Remove it."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _scale(self, module, args, losses):
        if not isinstance(losses, dict) or self.loss_key not in losses:
            found = (
                sorted(losses)
                if isinstance(losses, dict)
                else type(losses).__name__
            )
            raise KeyError(
                f'LossSpikeInjectionHook: no loss term '
                f'{self.loss_key!r} in the model output {found}'
            )
        value = losses[self.loss_key]
        if isinstance(value, (list, tuple)):
            losses[self.loss_key] = [v * self.factor for v in value]
        else:
            losses[self.loss_key] = value * self.factor
        return losses
