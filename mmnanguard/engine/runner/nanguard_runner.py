# Copyright (c) mmnanguard contributors. All rights reserved.
"""``NanGuardRunner``: the runner that ``configs/_base_/nanguard.py`` selects.

Why a Runner subclass selected by ``runner_type``
-------------------------------------------------
The include must turn protection on when added to the ``_base_`` list of an
unmodified mmdet, mmrotate or mmseg config. mmengine refuses two bases that
define the same top-level key (``KeyError: Duplicate key is not allowed
among bases``), so the include cannot define ``custom_hooks`` (rotated
RTMDet has an ``EMAHook``), ``default_hooks`` (every ``default_runtime.py``
defines it), ``optim_wrapper`` (the ``*_amp-*`` configs) or even
``custom_imports`` (mmseg's ConvNeXt/PoolFormer model bases and mmdet's
ConvNeXt configs define it). ``runner_type`` is defined by none of the
upstream configs, and the official ``tools/train.py`` of mmdet, mmrotate
and mmseg all build ``RUNNERS.build(cfg)`` when it is set. The include
names the runner with its scope, ``'mmnanguard.NanGuardRunner'``: mmengine's
``Registry.get`` imports ``mmnanguard.registry`` for a scoped name, which
imports mmnanguard (its stack mends and registrations) before the runner,
the model or any hook is built, so no ``custom_imports`` is needed.

What the runner adds, from the top-level ``nanguard = dict(...)`` key
(:class:`ProtectionSettings`):

* the :class:`NanGuardHook` with the guard settings, registered after the
  config's ``default_hooks`` and ``custom_hooks``, which stay untouched
  (hooks are ordered by priority, so where it is appended does not matter).
  A ``NanGuardHook`` already in ``custom_hooks`` is kept and not doubled;
* every hook of ``nanguard.hooks`` (``when='amp'``: only when an optim
  wrapper is an ``AmpOptimWrapper``). Adding a hook to the default
  protection is one line in ``configs/_base_/nanguard.py``;
* with ``check_labels=True``, ``CheckedCrossEntropyLoss`` for every
  upstream ``CrossEntropyLoss`` of the model (same loss; out-of-range labels
  such as a Cityscapes 255 raise an error naming the value);
* with ``module_swaps=[dict(replace='mmdet.FocalLoss',
  by='StableFocalLoss'), ...]``, the drop-in safe modules for the upstream
  ones (``configs/_base_/safe_modules/``);
* with ``validate_annotations=dict(...)``, a ``ValidateAnnotations``
  transform before the ``Pack*Inputs`` transform of the training pipeline,
  ``num_classes``/``angle_version``/``ignore_index`` taken from the model.

The optim wrapper is left as configured: the guard's step guard is
installed into whatever wrapper is built (``OptimWrapper``,
``AmpOptimWrapper``, ``CPUAmpOptimWrapper``, ``OptimWrapperDict``), and
``clip_grad``'s own norm is the one it checks. The train loop is not
touched either, so epoch- and iteration-based loops both work.
"""

import copy
import logging
from typing import Any, Dict, Optional

from mmengine.logging import print_log
from mmengine.optim import AmpOptimWrapper, OptimWrapperDict
from mmengine.runner import Runner

from mmnanguard.registry import HOOKS, RUNNERS, register_shared

from ..hooks import NanGuardHook
from .config_rewrites import (
    infer_validate_settings,
    insert_validate_annotations,
    swap_cross_entropy,
    swap_module_types,
)
from .protection import ProtectionSettings


def _log(msg: str, level: int = logging.INFO) -> None:
    print_log(f'NanGuardRunner: {msg}', logger='current', level=level)


@register_shared(RUNNERS)
class NanGuardRunner(Runner):
    """A :class:`~mmengine.runner.Runner` that adds mmnanguard's protection.

    Args:
        *args: Positional arguments of :class:`~mmengine.runner.Runner`.
        nanguard (dict, optional): The protection settings (see
            :class:`ProtectionSettings`). None reads the ``nanguard`` key of
            ``cfg``; a config without it gets the defaults.
        **kwargs: Keyword arguments of :class:`~mmengine.runner.Runner`
            (``Runner.from_cfg`` passes all of them by keyword).

    Example:
        >>> # in a config (what configs/_base_/nanguard.py does)
        >>> runner_type = 'mmnanguard.NanGuardRunner'
        >>> nanguard = dict(policy='skip', escalate_to='rollback')
    """

    def __init__(
        self,
        *args: Any,
        nanguard: Optional[Dict[str, Any]] = None,
        **kwargs: Any,
    ) -> None:
        cfg = kwargs.get('cfg') or {}
        if nanguard is None:
            nanguard = cfg.get('nanguard')
        self.protection = ProtectionSettings.from_dict(nanguard)
        #: What the rewrites changed, logged once the logger exists.
        self.protection_notes = []
        if self.protection.enabled:
            self._rewrite(kwargs, cfg)
        super().__init__(*args, **kwargs)

    # -- before building ------------------------------------------------------
    def _rewrite(self, kwargs: Dict[str, Any], cfg: Dict[str, Any]) -> None:
        """Apply the config rewrites to copies of the model and dataloader
        configs that ``Runner.__init__`` is about to receive."""
        p = self.protection
        model = kwargs.get('model')
        if (p.check_labels or p.module_swaps) and isinstance(model, dict):
            kwargs['model'] = model = copy.deepcopy(model)
        if p.check_labels and isinstance(model, dict):
            swapped = swap_cross_entropy(model)
            if swapped:
                self.protection_notes.append(
                    (
                        logging.INFO,
                        f'CheckedCrossEntropyLoss swapped in at {swapped}',
                    )
                )
        if p.module_swaps and isinstance(model, dict):
            swaps = {s['replace']: s['by'] for s in p.module_swaps}
            done = swap_module_types(model, swaps)
            self.protection_notes.append(
                (logging.INFO, f'module swaps: {done}')
                if done
                else (
                    logging.WARNING,
                    f'module_swaps matched no module of the model: {swaps}',
                )
            )
        loader = kwargs.get('train_dataloader')
        if p.validate_annotations is not None and isinstance(loader, dict):
            transform = infer_validate_settings(
                dict(cfg, model=model), p.validate_annotations
            )
            kwargs['train_dataloader'] = loader = copy.deepcopy(loader)
            changed, why_not = insert_validate_annotations(loader, transform)
            if changed:
                self.protection_notes.append(
                    (
                        logging.INFO,
                        f'{transform} inserted before '
                        f'Pack*Inputs in {changed} training pipeline(s)',
                    )
                )
            else:
                self.protection_notes.append(
                    (
                        logging.WARNING,
                        f'ValidateAnnotations not inserted: {why_not}',
                    )
                )

    # -- hooks -------------------------------------------------------------
    def register_hooks(
        self,
        default_hooks: Optional[Dict[str, Any]] = None,
        custom_hooks: Optional[list] = None,
    ) -> None:
        """Register the config's hooks, then the protection hooks.

        Args:
            default_hooks (dict, optional): As in ``Runner``.
            custom_hooks (list, optional): As in ``Runner``; not modified.
        """
        super().register_hooks(default_hooks, custom_hooks)
        for level, note in self.protection_notes:
            _log(note, level)
        if not self.protection.enabled:
            _log("policy='off': no protection added", logging.WARNING)
            return
        if any(isinstance(h, NanGuardHook) for h in self._hooks):
            _log(
                'a NanGuardHook is already in custom_hooks; it is kept and '
                'the nanguard settings are not applied',
                logging.WARNING,
            )
        else:
            self.register_hook(NanGuardHook(**self.protection.guard))
        amp = self._uses_amp()
        for hook_cfg in self.protection.hooks:
            hook_cfg = dict(hook_cfg)
            when = hook_cfg.pop('when')
            if when == 'amp' and not amp:
                continue
            hook = HOOKS.build(hook_cfg)
            if any(type(h) is type(hook) for h in self._hooks):
                _log(
                    f'a {type(hook).__name__} is already configured; the '
                    'one in nanguard.hooks is not added',
                    logging.WARNING,
                )
                continue
            self.register_hook(hook)
        names = [type(h).__name__ for h in self._hooks]
        _log(f'protection active, hooks in order: {names}')

    def _uses_amp(self) -> bool:
        wrapper = self.optim_wrapper
        if isinstance(wrapper, OptimWrapperDict):
            return any(
                isinstance(w, AmpOptimWrapper) for w in wrapper.values()
            )
        if isinstance(wrapper, AmpOptimWrapper):
            return True
        # not built yet: a config dict
        if isinstance(wrapper, dict):
            return 'Amp' in str(wrapper.get('type', ''))
        return False
