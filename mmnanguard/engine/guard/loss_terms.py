# Copyright (c) mmnanguard contributors. All rights reserved.
"""Know every loss term before backward."""

from mmnanguard.function_marks import mark

from .step_guard import StepGuard


def capture_loss_terms(model, step_guard: StepGuard) -> None:
    """Record ``parse_losses``' log vars in the step guard's record.

    ``BaseModel.train_step`` calls ``parse_losses`` right before
    ``optim_wrapper.update_params``; wrapping it on the model instance makes
    every term known before backward (for attribution and for vetoes). The
    model's own ``parse_losses`` still computes them. Installing twice only
    swaps the guard.

    Args:
        model (BaseModel): The unwrapped model.
        step_guard (StepGuard): Told the terms (``note_loss_terms``).
    """
    model._nanguard_step_guard = step_guard
    if getattr(model.parse_losses, '_nanguard_capture', False):
        return
    parse_losses = model.parse_losses

    def parse_and_capture(losses):
        loss, log_vars = parse_losses(losses)
        model._nanguard_step_guard.note_loss_terms(log_vars)
        return loss, log_vars

    model.parse_losses = mark(parse_and_capture, '_nanguard_capture')
