# Copyright (c) mmnanguard contributors. All rights reserved.
"""Load a training config, turning the one error the include can cause
into its fix.

The include ``mmnanguard::_base_/nanguard.py`` (and its variants) sets
``runner_type``. When another base of the config sets ``runner_type`` too
(an upstream ``FlexibleRunner`` config such as mmpretrain's
``mae/benchmarks/*-fsdp-*.py``), mmengine refuses the config with
``Duplicate key is not allowed among bases``, before any code of
mmnanguard runs. The fix is the include's settings-only twin
(``nanguard_settings.py``; ``X_settings.py`` for a variant ``X.py``),
which sets only the ``nanguard`` key: ``tools/train.py`` then builds the
protected counterpart of the other base's runner, and with the official
scripts one line of the config's own selects it (see
``docs/distributed.md``).
"""

from mmengine.config import Config

#: The include's settings-only twin, for the message.
SETTINGS_INCLUDE = 'mmnanguard::_base_/nanguard_settings.py'


class IncludeCollisionError(ValueError):
    """Two bases of a config set ``runner_type``, one of them being
    mmnanguard's include."""


def load_training_config(filename: str) -> Config:
    """``Config.fromfile(filename)``; a ``runner_type`` set by two bases
    raises :class:`IncludeCollisionError` with the fix.

    Args:
        filename (str): The config file.

    Returns:
        Config: The config.

    Raises:
        IncludeCollisionError: ``runner_type`` is set by two bases.
    """
    try:
        return Config.fromfile(filename)
    except KeyError as err:
        text = str(err)
        if 'Duplicate key' not in text or "'runner_type'" not in text:
            raise
        raise IncludeCollisionError(
            f'two bases of {filename!r} set runner_type (mmengine refuses a '
            "key set by two bases): mmnanguard's include sets "
            "runner_type='mmnanguard.NanGuardRunner' and another base sets "
            'its own. Include the settings-only twin instead: '
            f"{SETTINGS_INCLUDE!r} for 'mmnanguard::_base_/nanguard.py' "
            "(X_settings.py for a variant X.py); mmnanguard's "
            'tools/train.py then builds the protected counterpart of the '
            "other base's runner, and for the official tools/train.py add "
            "runner_type='mmnanguard.NanGuardFlexibleRunner' (or "
            "'mmnanguard.NanGuardRunner' for a Runner) to the config's own "
            'file.'
        ) from None


__all__ = ['IncludeCollisionError', 'SETTINGS_INCLUDE', 'load_training_config']
