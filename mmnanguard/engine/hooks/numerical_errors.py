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

Under ``torch.distributed`` the exception is raised as it is: the other
ranks would wait in the collective of a backward this rank never reaches.
"""

import logging
from typing import Any, Dict, List, Optional

from mmengine.dist import get_world_size
from mmengine.logging import print_log

from mmnanguard.function_marks import mark

from ..diagnosis.batch_checks import check_batch, model_classes
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
        if get_world_size() > 1:
            raise err
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
        optim_wrapper.zero_grad()
        self.step_guard.drop_raised_iteration(what, stage.value)
        return {}
