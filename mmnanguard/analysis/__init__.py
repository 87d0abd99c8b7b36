# Copyright (c) mmnanguard contributors. All rights reserved.
"""Checks to run before training: a stress test for loss modules
(:mod:`.loss_battery`) and a config doctor (:mod:`.doctor`)."""

from mmnanguard.config_walk import (
    LossEntry,
    build_in_scope,
    find_loss_configs,
    is_loss_class,
    iter_typed_configs,
    named_loss_modules,
    resolve_type,
)

__all__ = [
    'LossEntry',
    'build_in_scope',
    'find_loss_configs',
    'is_loss_class',
    'iter_typed_configs',
    'named_loss_modules',
    'resolve_type',
]
