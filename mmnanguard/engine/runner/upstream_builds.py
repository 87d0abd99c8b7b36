# Copyright (c) mmnanguard contributors. All rights reserved.
"""The ``nanguard`` settings are never dropped in silence by a runner build.

The upstream train scripts build ``Runner.from_cfg(cfg)``, or
``RUNNERS.build(cfg)`` (``cls.from_cfg``) when the config sets
``runner_type``. A config that has the include's ``nanguard`` settings but
whose own ``runner_type = 'FlexibleRunner'`` line replaced the include's
runner (a config's own keys override its bases'), or that lists the
settings-only twin with no runner, would build mmengine's plain runner,
which ignores ``nanguard``: protection would be off and nothing would say
so.

Once mmnanguard is imported (``python -m mmnanguard SCRIPT``, or any import
of it before the runner is built), ``Runner.from_cfg`` and
``FlexibleRunner.from_cfg`` check for that case:

* mmengine's own ``Runner`` or ``FlexibleRunner``: the protected
  counterpart is built instead, with the include's defaults under the
  config's settings, as mmnanguard's ``tools/train.py`` does
  (:func:`~.train_options.protect_with_defaults`), and a warning says so.
* another runner class (a toolbox's subclass), which mmnanguard has no
  counterpart of: a warning at start says that nothing is protected and
  names the fix (``NanGuardHook`` in ``custom_hooks``).

Nothing changes for a config without ``nanguard`` settings, for the
protected runners, and for a config with a ``NanGuardHook`` in
``custom_hooks``.
"""

import logging
from typing import Any, Callable

from mmengine.logging import print_log
from mmengine.registry import RUNNERS
from mmengine.runner import FlexibleRunner, Runner

from .protected_runner import ProtectedRunnerMixin
from .train_options import has_guard_hook, protect_with_defaults

_MARK = 'nanguard_checks_settings'


def protect_upstream_builds() -> None:
    """Put the check in front of ``Runner.from_cfg`` and
    ``FlexibleRunner.from_cfg`` (once; at ``import mmnanguard``)."""
    for runner_cls in (Runner, FlexibleRunner):
        original = runner_cls.__dict__['from_cfg']
        if getattr(original.__func__, _MARK, False):
            continue
        runner_cls.from_cfg = classmethod(_checked(original.__func__))


def _checked(build: Callable[..., Any]) -> Callable[..., Any]:
    def from_cfg(cls: type, cfg: Any) -> Any:
        if (
            cfg.get('nanguard') is None
            or issubclass(cls, ProtectedRunnerMixin)
            or has_guard_hook(cfg)
        ):
            return build(cls, cfg)
        if cls not in (Runner, FlexibleRunner):
            print_log(
                f'nanguard: the config has nanguard settings, but its runner '
                f'{cls.__name__} is a class mmnanguard has no protected '
                'counterpart of, so NOTHING IS PROTECTED. Add '
                "custom_hooks = [dict(type='NanGuardHook', policy='skip')] "
                '(docs/usage.md, "The hook alone").',
                logger='current',
                level=logging.WARNING,
            )
            return build(cls, cfg)
        written = cfg.get('runner_type', cls.__name__)
        cfg.runner_type = cls.__name__  # 'Runner' or 'FlexibleRunner'
        protect_with_defaults(cfg)
        protected = RUNNERS.get(cfg.runner_type)
        print_log(
            f'nanguard: the config has nanguard settings, but '
            f'runner_type={written!r} (its own line, which replaces the '
            "include's runner) would build a runner that ignores them; "
            f'{protected.__name__}, its protected counterpart, is built '
            'instead. Remove the runner_type line, or set '
            "runner_type='mmnanguard.NanGuardFlexibleRunner' (or "
            "'mmnanguard.NanGuardRunner') to say so yourself.",
            logger='current',
            level=logging.WARNING,
        )
        return protected.from_cfg(cfg)

    setattr(from_cfg, _MARK, True)
    from_cfg.__doc__ = build.__doc__
    return from_cfg
