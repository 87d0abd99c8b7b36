# Copyright (c) mmnanguard contributors. All rights reserved.
"""``assert_loss_stable``: the loss battery as a pytest helper."""

from typing import Optional, Union

import torch.nn as nn

from mmnanguard.analysis.loss_battery import check_module
from mmnanguard.analysis.loss_battery.table import format_number
from mmnanguard.config_walk import build_in_scope


def assert_loss_stable(
    loss_cfg_or_module: Union[dict, nn.Module],
    kind: Optional[str] = None,
    scope: Optional[str] = None,
    **settings,
) -> None:
    """Assert that a loss gives a finite value and gradient on every case
    of the battery (empty inputs, saturated predictions, degenerate boxes,
    out-of-range labels, fp16/bf16 autocast, weight variants).

    Args:
        loss_cfg_or_module (dict | nn.Module): A loss config (built with
            the registry under ``scope``) or a built loss.
        kind (str, optional): Input kind, one of
            :data:`mmnanguard.analysis.loss_battery.KINDS`; inferred from
            the class when None.
        scope (str, optional): Default scope to build a config in, e.g.
            'mmdet'. Defaults to None.
        **settings: ``num_classes``, ``angle_version``, ``ignore_index``.

    Raises:
        AssertionError: Naming each failing case with its value, gradient
            and verdict.
        ValueError: The kind cannot be inferred, or is unknown.
        TypeError: ``loss_cfg_or_module`` is neither a dict nor a module.

    Example:
        >>> assert_loss_stable(dict(type='mmdet.FocalLoss'), scope='mmdet')
    """
    loss = loss_cfg_or_module
    if isinstance(loss, dict):
        loss = build_in_scope(loss, scope)
    if not isinstance(loss, nn.Module):
        raise TypeError(
            'assert_loss_stable: expected a loss config dict or an '
            f'nn.Module, got {type(loss_cfg_or_module).__name__}'
        )
    report = check_module(loss, type(loss).__name__, kind, scope, **settings)
    if report.error:
        raise ValueError(report.error)
    failures = report.failures
    if failures:
        lines = [
            f'{r.case} [{r.group}]: {r.verdict}, value '
            f'{format_number(r.value)}, grad {format_number(r.grad)}'
            + (f' ({r.message})' if r.message else '')
            for r in failures
        ]
        raise AssertionError(
            f'{type(loss).__name__} ({report.kind}) fails {len(failures)} '
            f'of {len(report.results)} cases:\n  ' + '\n  '.join(lines)
        )
