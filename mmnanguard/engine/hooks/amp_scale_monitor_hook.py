# Copyright (c) mmnanguard contributors. All rights reserved.
"""AmpScaleMonitorHook: the GradScaler's loss scale and skipped steps."""

from collections import deque
from typing import Any, Dict, List, Optional, Tuple

from mmengine.hooks import Hook
from mmengine.optim import AmpOptimWrapper, OptimWrapperDict

from mmnanguard.compat.mmengine_private import static_loss_scale
from mmnanguard.registry import HOOKS, register_shared

from ..guard.exceptions import AmpScaleCollapseError
from ..optimizers.amp_precision import (
    bf16_supported,
    precision_of,
    switch_precision,
)

DATA_BATCH = Optional[Any]
ON_COLLAPSE = ('warn', 'raise', 'bf16', 'fp32')
#: on_collapse -> the precision it switches to first.
SWITCH_TO = dict(bf16='bfloat16', fp32='float32')


def amp_members(optim_wrapper) -> List[Tuple[str, AmpOptimWrapper]]:
    """``(name, wrapper)`` of every ``AmpOptimWrapper``: ``''`` for the
    runner's own wrapper, the key for members of an ``OptimWrapperDict``."""
    if isinstance(optim_wrapper, OptimWrapperDict):
        return [
            (k, w)
            for k, w in optim_wrapper.optim_wrappers.items()
            if isinstance(w, AmpOptimWrapper)
        ]
    return (
        [('', optim_wrapper)]
        if isinstance(optim_wrapper, AmpOptimWrapper)
        else []
    )


@register_shared(HOOKS)
class AmpScaleMonitorHook(Hook):
    """Watch the loss scale of every ``AmpOptimWrapper`` (each member of an
    ``OptimWrapperDict`` included) and act when it collapses.

    The GradScaler skips a step with inf/NaN gradients and halves its scale:
    a step was skipped exactly when the scale went down. Each iteration the
    hook compares the scale before and after the iteration and

    * publishes ``train/amp_scale`` (the scale after the iteration) and
      ``train/amp_skipped_steps`` (skipped steps so far) and
      ``train/amp_skip_ratio`` (skips among the last ``window`` scaler
      steps) through the MessageHub, so they reach the text log and every
      visualizer backend. Members of a dict get ``train/<key>.amp_scale``,
      ... The names avoid ``loss``: ``LogProcessor`` averages every key
      matching ``loss|time|grad_norm`` over its window, which would show a
      mean of scales instead of the scale;
    * logs every skip as ``AMP overflow at iteration 7, step skipped,
      scale 65536 -> 32768``: a GradScaler doing its job, not a NaN
      incident (mmengine logs ``grad_norm: inf`` for such steps);
    * declares a collapse when the scale falls below ``min_loss_scale``
      (in fp16; bf16 and fp32 need no scale) or more than
      ``max_skip_ratio`` of the last ``window`` scaler steps were skipped,
      and acts by ``on_collapse``: ``'warn'``; ``'raise'``
      (:class:`AmpScaleCollapseError`); ``'bf16'`` or ``'fp32'`` switch the
      rest of the run to that autocast precision (``'bf16'`` then escalates
      to fp32 on a second collapse; a collapse with nothing left to switch
      to raises). A switch survives rollback and resume.

    The GradScaler state itself is part of ``AmpOptimWrapper.state_dict``,
    so mmengine checkpoints and the guard's rollback snapshots carry it.
    The hook runs before ``NanGuardHook`` in ``after_train_iter``, so a scale
    restored by a rollback is never mistaken for a skip.

    A static ``loss_scale`` never moves: its skips are invisible to the
    scale, and the hook says so once at ``before_train``.

    Args:
        min_loss_scale (float): Floor of the scale. Defaults to 1.0.
        max_skip_ratio (float): Largest healthy share of skipped steps in
            the window, in (0, 1]. Defaults to 0.25.
        window (int): Scaler steps in the skip-ratio window. Defaults to
            100.
        on_collapse (str): ``'warn'``, ``'raise'``, ``'bf16'`` or
            ``'fp32'``. Defaults to ``'warn'``.

    Example:
        >>> custom_hooks = [dict(type='AmpScaleMonitorHook',
        ...                      min_loss_scale=1.0, on_collapse='bf16')]
    """

    priority = 'HIGH'  # after_train_iter before NanGuardHook's rollback

    def __init__(
        self,
        min_loss_scale: float = 1.0,
        max_skip_ratio: float = 0.25,
        window: int = 100,
        on_collapse: str = 'warn',
    ) -> None:
        if (
            isinstance(min_loss_scale, bool)
            or not isinstance(min_loss_scale, (int, float))
            or not min_loss_scale > 0
        ):
            raise ValueError(
                f'AmpScaleMonitorHook: min_loss_scale='
                f'{min_loss_scale!r} is invalid; expected a '
                'number > 0, e.g. 1.0'
            )
        if (
            isinstance(max_skip_ratio, bool)
            or not isinstance(max_skip_ratio, (int, float))
            or not 0 < max_skip_ratio <= 1
        ):
            raise ValueError(
                f'AmpScaleMonitorHook: max_skip_ratio='
                f'{max_skip_ratio!r} is invalid; expected a '
                'number in (0, 1], e.g. 0.25'
            )
        if (
            isinstance(window, bool)
            or not isinstance(window, int)
            or window < 1
        ):
            raise ValueError(
                f'AmpScaleMonitorHook: window={window!r} is '
                'invalid; expected an integer >= 1'
            )
        if on_collapse not in ON_COLLAPSE:
            raise ValueError(
                f'AmpScaleMonitorHook: on_collapse='
                f'{on_collapse!r} is invalid; allowed values '
                f'are {ON_COLLAPSE}'
            )
        self.min_loss_scale = float(min_loss_scale)
        self.max_skip_ratio = float(max_skip_ratio)
        self.window = window
        self.on_collapse = on_collapse
        #: Per member: skipped steps, scaler steps, collapses.
        self.skipped: Dict[str, int] = {}
        self.steps: Dict[str, int] = {}
        self.collapses: Dict[str, int] = {}
        #: Per member: precision switched to (``'bfloat16'``/``'float32'``).
        self.precision: Dict[str, str] = {}
        self._recent: Dict[str, deque] = {}
        self._collapsed: Dict[str, bool] = {}
        self._before: Dict[str, Tuple[float, int]] = {}
        #: The newest known scale per member (a guarded wrapper's read).
        self._scales: Dict[str, float] = {}
        self._iteration = -1

    # -- stages -----------------------------------------------------------
    def before_train(self, runner) -> None:
        """Check the wrappers; re-apply a precision switch after resume."""
        members = amp_members(runner.optim_wrapper)
        if not members:
            runner.logger.warning(
                'AmpScaleMonitorHook: the runner has no AmpOptimWrapper; '
                'nothing to monitor'
            )
        for name, wrapper in members:
            if self.on_collapse == 'bf16' and not bf16_supported(wrapper):
                raise ValueError(
                    f"AmpScaleMonitorHook: on_collapse='bf16' but the "
                    f'optim wrapper {name or "optim_wrapper"!r} trains on a '
                    "device without bf16; use on_collapse='fp32'"
                )
            if static_loss_scale(wrapper) is not None:
                runner.logger.warning(
                    f'AmpScaleMonitorHook: {_label(name)} uses a static '
                    f'loss_scale={static_loss_scale(wrapper)}; a static '
                    'scale never moves, so skipped steps cannot be seen'
                )
            if (
                name in self.precision
                and precision_of(wrapper) != self.precision[name]
            ):
                switch_precision(
                    wrapper, self.precision[name], reset_scale=False
                )
                runner.logger.warning(
                    f'AmpScaleMonitorHook: {_label(name)} resumes in '
                    f'{self.precision[name]} (switched after a loss-scale '
                    'collapse before the checkpoint)'
                )
            for table in (self.skipped, self.steps, self.collapses):
                table.setdefault(name, 0)
            self._recent.setdefault(name, deque(maxlen=self.window))
            self._collapsed.setdefault(name, False)

    def before_train_iter(
        self, runner, batch_idx: int, data_batch: DATA_BATCH = None
    ) -> None:
        """Read the scale before the step of every wrapper that no guard
        watches (a guarded wrapper reports its GradScaler step itself)."""
        self._iteration = runner.iter
        self._before = {
            name: _scaler_state(wrapper)
            for name, wrapper in amp_members(runner.optim_wrapper)
            if getattr(wrapper, 'nanguard', None) is None
        }

    def after_train_iter(
        self,
        runner,
        batch_idx: int,
        data_batch: DATA_BATCH = None,
        outputs: Optional[dict] = None,
    ) -> None:
        """Count skips, publish the scale, act on a collapse."""
        for name, wrapper in amp_members(runner.optim_wrapper):
            if getattr(wrapper, 'nanguard', None) is not None:
                step = wrapper.amp_step_of(runner.iter)
                if step is None:  # no scaler step in this iteration
                    scale = self._scales.get(name)
                    if scale is None:
                        continue
                else:
                    self._observe(
                        runner,
                        name,
                        (step.scale_before, step.tracker_before),
                        (step.scale_after, step.tracker_after),
                    )
                    scale = step.scale_after
            else:
                scale, tracker = _scaler_state(wrapper)
                before = self._before.get(name)
                if before is not None:
                    self._observe(runner, name, before, (scale, tracker))
            self._scales[name] = scale
            self._publish(runner, name, scale)
            if self._check_collapse(runner, name, wrapper, scale):
                self._scales[name] = 1.0

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        """Store counts, the skip window and any precision switch."""
        checkpoint['amp_scale_monitor'] = dict(
            skipped=dict(self.skipped),
            steps=dict(self.steps),
            collapses=dict(self.collapses),
            precision=dict(self.precision),
            recent={k: list(v) for k, v in self._recent.items()},
        )

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        """Restore :meth:`before_save_checkpoint`'s state (the precision is
        applied in ``before_train``)."""
        state = checkpoint.get('amp_scale_monitor')
        if not state:
            return
        self.skipped = {k: int(v) for k, v in state['skipped'].items()}
        self.steps = {k: int(v) for k, v in state['steps'].items()}
        self.collapses = {k: int(v) for k, v in state['collapses'].items()}
        self.precision = dict(state['precision'])
        self._recent = {
            k: deque((bool(x) for x in v), maxlen=self.window)
            for k, v in state['recent'].items()
        }

    def after_train(self, runner) -> None:
        """One summary line."""
        runner.logger.info(
            f'AmpScaleMonitor summary: skipped={self.skipped} of '
            f'steps={self.steps}, collapses={self.collapses}, '
            f'precision switches={self.precision}'
        )

    # -- helpers ----------------------------------------------------------
    def _observe(
        self,
        runner,
        name: str,
        before: Tuple[float, int],
        after: Tuple[float, int],
    ) -> None:
        """A scale decrease is a skipped step; a growth or a moved growth
        tracker is a taken step; neither means no scaler step."""
        (scale0, tracker0), (scale1, tracker1) = before, after
        if scale1 < scale0:
            skipped = True
        elif scale1 > scale0 or tracker1 != tracker0:
            skipped = False
        else:
            return
        self.steps[name] += 1
        self._recent[name].append(skipped)
        if skipped:
            self.skipped[name] += 1
            runner.logger.warning(
                f'AMP overflow at iteration {runner.iter}, step skipped, '
                f'scale {scale0:g} -> {scale1:g}{_of(name)} (the GradScaler '
                'at work, not a NaN incident)'
            )

    def skip_ratio(self, name: str = '') -> float:
        """Skipped share of the last ``window`` scaler steps (counted over
        ``window``, so a short run cannot look worse than it is)."""
        return sum(self._recent.get(name, ())) / self.window

    def _publish(self, runner, name: str, scale: float) -> None:
        prefix = f'train/{name}.' if name else 'train/'
        hub = runner.message_hub
        hub.update_scalar(f'{prefix}amp_scale', scale)
        hub.update_scalar(f'{prefix}amp_skipped_steps', self.skipped[name])
        hub.update_scalar(f'{prefix}amp_skip_ratio', self.skip_ratio(name))

    def _check_collapse(
        self, runner, name: str, wrapper, scale: float
    ) -> bool:
        """Act on a collapse; return whether the precision was switched
        (which resets the scale to 1.0)."""
        causes = []
        if scale < self.min_loss_scale and precision_of(wrapper) == 'float16':
            causes.append(
                f'scale {scale:g} < min_loss_scale=' f'{self.min_loss_scale:g}'
            )
        ratio = self.skip_ratio(name)
        if ratio > self.max_skip_ratio:
            causes.append(
                f'{sum(self._recent[name])} of the last '
                f'{self.window} steps skipped ({ratio:.0%} > '
                f'max_skip_ratio={self.max_skip_ratio:.0%})'
            )
        was_collapsed = self._collapsed[name]
        self._collapsed[name] = bool(causes)
        if not causes or was_collapsed:
            return False  # act once per collapse, re-armed when it is over
        self.collapses[name] += 1
        message = (
            f'AMP loss scale collapsed at iteration {runner.iter}'
            f'{_of(name)} in {precision_of(wrapper)}: '
            f'{"; ".join(causes)}'
        )
        target = self._switch_target(wrapper)
        if self.on_collapse == 'warn':
            runner.logger.warning(f'AmpScaleMonitor: {message}')
            return False
        if self.on_collapse == 'raise' or target is None:
            if target is None and self.on_collapse != 'raise':
                message += ' (no lower precision left to switch to)'
            runner.logger.error(f'AmpScaleMonitor: {message}')
            raise AmpScaleCollapseError(message)
        switch_precision(wrapper, target)
        self.precision[name] = target
        self._recent[name].clear()
        self._collapsed[name] = False
        runner.logger.warning(
            f'AmpScaleMonitor: {message}. !!! SWITCHING{_of(name)} TO '
            f'{target.upper()} FOR THE REST OF THE RUN !!! (loss scale '
            'reset to 1.0; the GradScaler keeps skipping non-finite '
            'steps)'
        )
        return True

    def _switch_target(self, wrapper) -> Optional[str]:
        current = precision_of(wrapper)
        first = SWITCH_TO.get(self.on_collapse)
        if first is None:
            return None
        if current == 'float16':
            return first
        if current == 'bfloat16':
            return 'float32'
        return None


def _scaler_state(wrapper) -> Tuple[float, int]:
    """The scale and the growth tracker (consecutive unskipped steps)."""
    scaler = wrapper.loss_scaler
    tracker = getattr(scaler, '_growth_tracker', None)
    return float(scaler.get_scale()), (
        int(tracker.item()) if tracker is not None else 0
    )


def _label(name: str) -> str:
    return f'optim_wrapper[{name!r}]' if name else 'the optim wrapper'


def _of(name: str) -> str:
    return f' ({_label(name)})' if name else ''
