# Copyright (c) mmnanguard contributors. All rights reserved.
"""The logged scalars of a dropped step, taken out of the log's means.

mmengine's ``LogProcessor`` shows, for every ``train/`` scalar whose name
matches its ``mean_pattern`` (``loss``, each loss term, ``grad_norm``),
the mean of the last ``window_size`` values in the MessageHub's
``HistoryBuffer`` (mmdet's default runtime: 50), and ``LoggerHook`` hands
the same means to the visualizer backends. One ``inf`` in the window makes
every mean ``inf`` until the window has passed it. In an iteration,
the optim wrapper writes ``grad_norm`` during the step (with norm
``clip_grad``) and ``RuntimeInfoHook`` (priority ``VERY_HIGH``) writes the
model's ``log_vars`` in ``after_train_iter``; both come before
``NanGuardHook`` (``ABOVE_NORMAL``), which comes before ``LoggerHook``
(``BELOW_NORMAL``) reads the buffers. So the guard can take the values of
a step it dropped (skipped, or rolled back) back out of the buffers before
any log line or backend sees them, with the verdict it already read: no
host read is added.

Only public mmengine API is used: ``MessageHub.log_scalars`` (the hub's
own dict of buffers, as the property documents), ``HistoryBuffer.data``,
``HistoryBuffer.max_length`` and its constructor; checked on mmengine
0.10.7 and onedl-mmengine 0.10.12.
"""

from typing import Dict, List, Optional

from mmengine.logging import HistoryBuffer

from .verdict import IterationOutcome

#: The scalar the optim wrapper writes in each step with norm clipping.
GRAD_NORM_KEY = 'train/grad_norm'


def drop_last_values(buffers: Dict[str, HistoryBuffer], key: str, n: int):
    """Remove the last ``n`` values of ``buffers[key]``; the key itself when
    no value would be left (a ``LogProcessor`` mean of an empty buffer is
    0/0, NaN; without the key the log line leaves the scalar out).

    Args:
        buffers (dict): ``MessageHub.log_scalars``.
        key (str): The scalar, e.g. ``'train/loss'``.
        n (int): How many of its newest values to remove (>= 1).
    """
    buffer = buffers[key]
    values, counts = buffer.data
    if n >= len(values):
        del buffers[key]
    else:
        buffers[key] = HistoryBuffer(
            values[:-n], counts[:-n], buffer.max_length
        )


class DroppedStepScalars:
    """Keep the logged scalars of each dropped step out of the smoothed
    values of the text log and the visualizer backends.

    Called once per iteration, after ``RuntimeInfoHook`` and before
    ``LoggerHook``, with the iteration's outcome and the model's
    ``log_vars``. It counts the values that each watched scalar (every key
    of ``log_vars`` and ``grad_norm``) received since the last optimizer
    step was decided, from the buffers' lengths; when a step of the
    iteration was dropped (by the guard, or by the GradScaler under AMP),
    those values are removed, so that every mean is the mean of the kept
    iterations. Under gradient accumulation, that is every micro-batch of
    the dropped step.

    Where the length before the iteration is unknown (the first iteration
    seen, after a start or a resume) or the buffer is full
    (``max_length``), a scalar of ``log_vars`` counts one value for the
    iteration and ``grad_norm`` one per optimizer step.
    """

    def __init__(self) -> None:
        #: Length of each watched buffer after the previous iteration.
        self._lengths: Dict[str, int] = {}
        #: Values written since the last decided step, per scalar.
        self._pending: Dict[str, int] = {}

    def after_iteration(
        self, runner, outcome: IterationOutcome, log_vars: Optional[dict]
    ) -> List[str]:
        """Remove the iteration's values from the buffers if its step was
        dropped; a step the guard dropped is logged with the scalars left
        out (a GradScaler skip is counted in ``nanguard_amp_skipped``).

        Args:
            runner (Runner): The runner (its message hub and logger).
            outcome (IterationOutcome): What the guard's steps decided.
            log_vars (dict, optional): The ``outputs`` of the iteration.

        Returns:
            list[str]: The scalars whose values were removed (without the
            ``train/`` prefix), in the order of ``log_vars``.
        """
        buffers = runner.message_hub.log_scalars
        keys = [f'train/{name}' for name in log_vars or {}]
        keys.append(GRAD_NORM_KEY)
        for key in keys:
            if key in buffers:
                written = self._written(key, buffers[key], outcome)
                self._pending[key] = self._pending.get(key, 0) + written
        removed = []
        if outcome.verdicts:  # a step was decided: taken or dropped
            if outcome.skipped or outcome.amp_skipped:
                for key, n in self._pending.items():
                    if n and key in buffers:
                        drop_last_values(buffers, key, n)
                        removed.append(key[len('train/') :])
            self._pending = {}
        self._lengths = {
            key: len(buffers[key].data[0]) for key in keys if key in buffers
        }
        if removed and outcome.skipped:
            runner.logger.info(
                f'nanguard: the step of iteration {runner.iter} was dropped; '
                f'its {", ".join(removed)} are left out of the logged means'
            )
        return removed

    def _written(
        self, key: str, buffer: HistoryBuffer, outcome: IterationOutcome
    ) -> int:
        """How many values ``key`` received in this iteration."""
        length = len(buffer.data[0])
        before = self._lengths.get(key)
        if before is not None and length < buffer.max_length:
            return max(length - before, 0)
        return len(outcome.verdicts) if key == GRAD_NORM_KEY else 1
