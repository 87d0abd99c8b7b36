# Copyright (c) mmnanguard contributors. All rights reserved.
"""A numerical routine that raises on the data, handled as an incident.

A degenerate box does not always make a NaN: mmrotate's ``GDLoss_v1``
inverts the target's covariance, and for a box of width 0
``torch.linalg.inv`` raises ``LinAlgError`` ("the input matrix is
singular") instead. Such an exception ends the iteration before the step.
When the batch fails the data checks (the same checks as the diagnosis:
non-finite or extreme pixels, zero-size or non-finite boxes, labels out of
range), the exception is the data's: the step is dropped as for a
non-finite loss (gradients zeroed, the buffers the forward wrote restored)
and the incident is recorded and diagnosed, naming the file and the
record. With clean data the exception is a bug, not a data fault: it is
logged with the batch's files and raised.

Under ``torch.distributed`` the step cannot be dropped on one rank: the
other ranks wait in the collectives of a backward this rank never reaches
(and a loss may hold collectives of its own, as mmdet's ``reduce_mean``,
which a stand-in backward would not match). The exception is raised, and
when the data checks fail the log names the records first, with the fix:
the records themselves, or ``ValidateAnnotations(policy='filter')``, which
drops such instances before the model.
"""

import logging
from typing import Any, Dict, List, Optional

from mmengine.dist import get_rank, get_world_size
from mmengine.logging import print_log

from mmnanguard.function_marks import mark

from ..diagnosis.batch_checks import check_batch, model_classes
from ..diagnosis.finding_words import describe_finding
from ..guard.exceptions import (
    NUMERICAL_ERRORS,
    describe_error,
    raised_stage,
)
from ..guard.report import samples_of
from ..guard.step_guard import StepGuard
from ..incident.batch_layout import sample_name


def _files(data_batch: Any) -> List[str]:
    return [sample_name(s) for s in samples_of(data_batch)]


def _log_distributed_stop(
    what: str, stage: str, iteration: int, findings: List[Dict[str, Any]]
) -> None:
    """Name the failed data checks of a batch whose exception stops a
    distributed run, and the fix."""
    shown = '\n  '.join(describe_finding(f) for f in findings[:10])
    more = len(findings) - 10
    if more > 0:
        shown += f'\n  ... and {more} more'
    filter_ = ''
    if any(f.get('index') is not None for f in findings):  # instances
        filter_ = (
            ", or add dict(type='ValidateAnnotations', policy='filter') "
            'before Pack*Inputs (it drops such instances before the model)'
        )
    print_log(
        f'nanguard: {what} raised in the {stage} at iteration {iteration} '
        f'on rank {get_rank()}, on a batch whose data checks fail:\n  '
        f'{shown}\nUnder torch.distributed the step cannot be dropped on '
        'one rank (the other ranks wait in the collectives of its '
        f'backward): training stops. Fix or delete these records{filter_}'
        ', and resume.',
        logger='current',
        level=logging.ERROR,
    )


class NumericalErrors:
    """Turn a data-caused numerical exception of ``train_step`` into a
    dropped step; see the module docstring.

    Args:
        step_guard (StepGuard): Records the dropped step.
        model (nn.Module): The unwrapped model (its head's classes for the
            label checks).
        ann_file (str, optional): The training set's annotation file.
    """

    def __init__(
        self, step_guard: StepGuard, model, ann_file: Optional[str] = None
    ) -> None:
        self.step_guard = step_guard
        self.model = model
        self.ann_file = ann_file

    def install(self, runner_model) -> None:
        """Wrap ``runner_model.train_step`` on the instance (installing
        twice only swaps the handler)."""
        runner_model._nanguard_numerical_errors = self
        train_step = runner_model.train_step
        if getattr(train_step, '_nanguard_numerical', False):
            return

        def guarded(data: Any, optim_wrapper: Any) -> Dict[str, Any]:
            try:
                return train_step(data, optim_wrapper)
            except NUMERICAL_ERRORS as err:
                handler = runner_model._nanguard_numerical_errors
                return handler.handle(data, optim_wrapper, err)

        runner_model.train_step = mark(guarded, '_nanguard_numerical')

    def handle(
        self, data: Any, optim_wrapper: Any, err: BaseException
    ) -> Dict[str, Any]:
        """Drop the step when the data checks fail; raise ``err`` otherwise.

        Returns:
            dict: No log vars (the iteration logged nothing).
        """
        stage = raised_stage(err)
        what = describe_error(err)
        iteration = self.step_guard.iteration
        num_classes, ignore_index = model_classes(self.model)
        findings = check_batch(
            data, None, num_classes, ignore_index, ann_file=self.ann_file
        )
        if not findings:
            print_log(
                f'nanguard: {what} raised in the {stage} at iteration '
                f'{iteration}, on the batch {_files(data)}, which passes '
                'the data checks: not a data fault, training stops',
                logger='current',
                level=logging.ERROR,
            )
            raise err
        if get_world_size() > 1:
            _log_distributed_stop(what, stage.value, iteration, findings)
            raise err
        optim_wrapper.zero_grad()
        self.step_guard.drop_raised_iteration(what, stage.value)
        return {}
