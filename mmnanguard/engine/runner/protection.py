# Copyright (c) mmnanguard contributors. All rights reserved.
"""The top-level ``nanguard = dict(...)`` config key, parsed and validated.

The key holds the :class:`~mmnanguard.engine.guard.GuardSettings` of the
:class:`~mmnanguard.engine.hooks.NanGuardHook` plus the keys that belong to
the runner (:data:`RUNNER_KEYS`). Errors name the key, the bad value and the
allowed values, and are raised before anything is built.
"""

import copy
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from ..guard import GuardSettings

#: Keys of ``nanguard`` read by the runner itself; every other key is a
#: :class:`GuardSettings` field.
RUNNER_KEYS = ('hooks', 'check_labels', 'validate_annotations', 'module_swaps')
#: ``when`` values of an entry of ``nanguard.hooks``.
HOOK_CONDITIONS = ('always', 'amp')
#: ``policy='off'`` adds no protection at all (``tools/train.py --guard off``).
OFF = 'off'


@dataclass
class ProtectionSettings:
    """What :class:`NanGuardRunner` adds to a config.

    Args:
        enabled (bool): False for ``policy='off'``.
        guard (dict): The ``NanGuardHook`` settings (validated).
        hooks (list[dict]): More protection hooks, each a hook config with
            an optional ``when`` (``'always'`` or ``'amp'``: only when the
            optim wrapper is an AMP wrapper).
        check_labels (bool): Wrap every built upstream
            ``CrossEntropyLoss`` that takes class labels (not
            ``use_mask=True``) in the drop-in ``CheckedCrossEntropyLoss``.
            Defaults to True (the value
            ``configs/_base_/nanguard_settings.py`` sets).
        validate_annotations (dict, optional): Settings of the
            ``ValidateAnnotations`` transform inserted into the training
            pipeline; None inserts nothing.
        module_swaps (list[dict]): ``dict(replace=OLD_TYPE, by=NEW_TYPE)``:
            every model config dict of type ``OLD_TYPE`` gets ``NEW_TYPE``
            (drop-in safe modules, same arguments).
    """

    enabled: bool = True
    guard: Dict[str, Any] = field(default_factory=dict)
    hooks: List[Dict[str, Any]] = field(default_factory=list)
    check_labels: bool = True
    validate_annotations: Optional[Dict[str, Any]] = None
    module_swaps: List[Dict[str, str]] = field(default_factory=list)

    @classmethod
    def from_dict(cls, cfg: Optional[Dict[str, Any]]) -> 'ProtectionSettings':
        """Parse the ``nanguard`` config key.

        Args:
            cfg (dict, optional): The key's value; None means defaults.

        Returns:
            ProtectionSettings: The parsed settings.

        Raises:
            TypeError: ``cfg`` or one of its runner keys has the wrong type.
            ValueError: A value is invalid (named with the allowed values).
        """
        if cfg is None:
            cfg = {}
        if not isinstance(cfg, dict):
            raise TypeError(
                f'nanguard={cfg!r} is invalid; expected a dict '
                "such as dict(policy='skip')"
            )
        cfg = copy.deepcopy(dict(cfg))
        runner_part = {k: cfg.pop(k) for k in RUNNER_KEYS if k in cfg}
        if cfg.get('policy') == OFF:
            return cls(enabled=False)
        guard = GuardSettings.from_dict(cfg).to_dict()
        hooks = _parse_hooks(runner_part.get('hooks', []))
        check_labels = runner_part.get('check_labels', True)
        if not isinstance(check_labels, bool):
            raise TypeError(
                f'nanguard.check_labels={check_labels!r} is '
                'invalid; expected True or False'
            )
        validate = runner_part.get('validate_annotations')
        if validate is not None and not isinstance(validate, dict):
            raise TypeError(
                f'nanguard.validate_annotations={validate!r} is invalid; '
                "expected None or a dict such as dict(policy='warn')"
            )
        swaps = _parse_swaps(runner_part.get('module_swaps', []))
        return cls(
            enabled=True,
            module_swaps=swaps,
            guard=guard,
            hooks=hooks,
            check_labels=check_labels,
            validate_annotations=None if validate is None else dict(validate),
        )


def _parse_hooks(hooks: Any) -> List[Dict[str, Any]]:
    if not isinstance(hooks, (list, tuple)):
        raise TypeError(
            f'nanguard.hooks={hooks!r} is invalid; expected a '
            "list of hook configs such as [dict(type='X')]"
        )
    parsed = []
    for i, hook in enumerate(hooks):
        if not isinstance(hook, dict) or 'type' not in hook:
            raise TypeError(
                f'nanguard.hooks[{i}]={hook!r} is invalid; '
                "expected a dict with a 'type'"
            )
        hook = dict(hook)
        when = hook.setdefault('when', 'always')
        if when not in HOOK_CONDITIONS:
            raise ValueError(
                f'nanguard.hooks[{i}].when={when!r} is invalid; '
                f'allowed values are {HOOK_CONDITIONS}'
            )
        parsed.append(hook)
    return parsed


def _parse_swaps(swaps: Any) -> List[Dict[str, str]]:
    if not isinstance(swaps, (list, tuple)):
        raise TypeError(
            f'nanguard.module_swaps={swaps!r} is invalid; '
            "expected a list of dict(replace='OldType', "
            "by='NewType')"
        )
    parsed = []
    for i, swap in enumerate(swaps):
        if (
            not isinstance(swap, dict)
            or set(swap) != {'replace', 'by'}
            or not all(isinstance(v, str) for v in swap.values())
        ):
            raise TypeError(
                f'nanguard.module_swaps[{i}]={swap!r} is '
                "invalid; expected dict(replace='OldType', "
                "by='NewType')"
            )
        parsed.append(dict(swap))
    return parsed
