# Copyright (c) mmnanguard contributors. All rights reserved.
"""The fix a stop message names."""

from typing import Any, Optional

from .snapshot import unwrap_model


def stop_fix(runner, report: Any) -> Optional[str]:
    """The fix a stop message names: the first remedy of the stopping
    incident's diagnosis, else (no diagnosis ran) the sentence for a head
    that feeds encoded deltas to a box loss, found in the built model.

    Args:
        runner (Runner): The runner.
        report (IncidentReport, optional): The stopping incident's report.

    Returns:
        str | None: The fix, or None when nothing names one.
    """
    diagnosis = (report.get('diagnosis') if report is not None else None) or {}
    if diagnosis.get('remedy'):
        return diagnosis['remedy'][0]
    # imported here: the models package is not needed to guard a step
    from mmnanguard.models.loss_kind import encoded_deltas_fix

    try:
        return encoded_deltas_fix(unwrap_model(runner.model))
    except Exception as err:  # noqa: BLE001  (the stop must not fail)
        runner.logger.warning(
            'nanguard: could not check the heads for a box loss fed '
            f'encoded deltas: {type(err).__name__}: {err}'
        )
        return None
