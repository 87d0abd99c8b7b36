# Copyright (c) mmnanguard contributors. All rights reserved.
"""Rule on box losses fed encoded deltas: a head with
``reg_decoded_bbox=False`` whose box loss reads boxes (IoU, rotated IoU,
Gaussian ``GDLoss`` / ``GDLoss_v1``), decided on the built heads
(:func:`mmnanguard.models.loss_kind.encoded_deltas_into_box_loss`)."""

import inspect
from typing import Any, List

import torch.nn as nn
from mmengine.registry import MODELS, DefaultScope

from mmnanguard.config_walk import build_in_scope
from mmnanguard.models.loss_kind import (
    config_path,
    describe_mismatch,
    encoded_deltas_into_box_loss,
)

from .context import DoctorContext
from .finding import Finding

RULE = 'box-loss-on-encoded-deltas'
#: Errors a head config raises when built alone; the rule then says so.
BUILD_ERRORS = (KeyError, TypeError, ValueError, AssertionError, ImportError)


def _stage_cfg(model: dict, key: str, stage: str):
    value = model.get(key)
    return value.get(stage, value) if isinstance(value, dict) else value


def _has_box_coder(cfg: Any) -> bool:
    """Whether a head config holds a ``bbox_coder`` (at any depth): only
    such a head encodes its targets as deltas."""
    if isinstance(cfg, dict):
        return 'bbox_coder' in cfg or any(map(_has_box_coder, cfg.values()))
    if isinstance(cfg, (list, tuple)):
        return any(map(_has_box_coder, cfg))
    return False


def _with_settings(ctx: DoctorContext, key: str, cfg: dict) -> dict:
    """``cfg`` with the model's train/test settings of its stage, where
    its class takes them."""
    model = ctx.cfg.get('model') or {}
    cls = ctx.resolve(cfg['type'], MODELS)
    try:
        params = inspect.signature(cls).parameters if cls else {}
    except (TypeError, ValueError):
        params = {}
    stage = {'rpn_head': 'rpn', 'roi_head': 'rcnn'}.get(key)
    for name in ('train_cfg', 'test_cfg'):
        if name in params and name not in cfg:
            cfg[name] = (
                _stage_cfg(model, name, stage) if stage else model.get(name)
            )
    return cfg


def _built_heads(ctx: DoctorContext, findings: List[Finding]) -> nn.Module:
    """The model's box heads (``*head`` keys holding a ``bbox_coder``),
    each built alone with its train/test settings (no backbone, no
    neck)."""
    model = ctx.cfg.get('model') or {}
    heads = nn.ModuleDict()
    for key, value in model.items():
        if not key.endswith('head') or not isinstance(value, dict):
            continue
        if 'type' not in value or not _has_box_coder(value):
            continue
        try:
            with DefaultScope.overwrite_default_scope(ctx.scope):
                heads[key] = build_in_scope(
                    _with_settings(ctx, key, dict(value)), ctx.scope
                )
        except BUILD_ERRORS as err:
            findings.append(
                Finding(
                    RULE,
                    'info',
                    f'could not build model.{key} alone to check what its '
                    f'box loss is fed: {type(err).__name__}: {err}',
                    f'python tools/check_loss.py CONFIG  # model.{key}',
                    f'model.{key}',
                )
            )
    return heads


def check_box_loss_inputs(ctx: DoctorContext) -> List[Finding]:
    """A box-taking loss fed encoded deltas (``reg_decoded_bbox=False``)."""
    findings: List[Finding] = []
    heads = _built_heads(ctx, findings)
    for record in encoded_deltas_into_box_loss(heads):
        head = config_path(record.head)
        findings.append(
            Finding(
                RULE,
                'error',
                describe_mismatch(record).replace('nanguard: ', '', 1),
                f'{head}.reg_decoded_bbox=True',
                f'{head}.{record.loss_name}',
            )
        )
    return findings
