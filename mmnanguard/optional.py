# Copyright (c) mmnanguard contributors. All rights reserved.
"""Optional upstream packages: mmrotate, mmseg and the toolboxes (mmyolo,
mmpretrain, mmpose, mmocr).

``import mmnanguard`` needs only mmengine, mmcv and mmdet. The rotated-box
modules (``SafeDeltaXYWHTRBBoxCoder``, ``SinCosAngleCoder``,
``SafeRotatedIoULoss``, ``SafeGDLoss``) register when mmrotate imports; the
mmseg-specific paths (the mmseg branch of ``CheckedCrossEntropyLoss``, the
segmentation rules of the doctor) import mmseg only when a config uses it.

Where mmrotate is missing, each rotated module name is registered as a
placeholder that raises :class:`MissingPackageError`, so a config that
names it stops with a message saying which package to install instead of
mmengine's ``KeyError: 'SafeGDLoss is not in the mmdet::model registry'``.
:func:`require_packages` does the same for a config whose scope or
``type='mmrotate.X'`` names a package that is missing.
"""

import warnings
from importlib import import_module
from typing import Any, Callable, Dict, Iterable, Optional, Tuple

from mmengine.registry import Registry

from mmnanguard.supported_stacks import (
    OPTIONAL_EXTRAS,
    TOOLBOXES,
    install_line,
)

#: Optional package (import name) -> how to install it, for the family
#: (OpenMMLab or OneDL) of the installed mmdet; the toolboxes of
#: :data:`~mmnanguard.supported_stacks.TOOLBOXES` (mmyolo, mmpretrain,
#: mmpose, mmocr, mmaction2), whose configs the include protects where they
#: are installed.
INSTALL = {name: install_line(name) for name in (*OPTIONAL_EXTRAS, *TOOLBOXES)}

#: import name -> None (importable) or why it is not; filled on first use.
_STATUS: Dict[str, Optional[str]] = {}


class MissingPackageError(ModuleNotFoundError):
    """A config or a call needs an optional package that is not
    importable."""


def unavailable_reason(package: str) -> Optional[str]:
    """Why ``package`` cannot be imported, or None if it can.

    The package is imported once (after :mod:`mmnanguard.compat` has mended
    the stack). An upstream version check that fails on import (mmrotate
    1.0.0rc1 asserts ``mmdet <= 3.1.0``) counts as not importable, with its
    message as the reason, and is reported once with a warning.

    Args:
        package (str): An import name from :data:`INSTALL`.

    Returns:
        str | None: None when ``import package`` works, else the reason.

    Raises:
        ValueError: ``package`` is not one of :data:`INSTALL`.
    """
    if package not in INSTALL:
        raise ValueError(
            f'optional package must be one of {sorted(INSTALL)}, '
            f'got {package!r}'
        )
    if package not in _STATUS:
        try:
            import_module(package)
            _STATUS[package] = None
        except ModuleNotFoundError as err:
            if err.name != package:
                _STATUS[package] = f'it fails to import: {err}'
            else:
                _STATUS[package] = 'it is not installed'
        except (ImportError, AssertionError) as err:
            _STATUS[package] = f'it fails to import: {err!r}'
        if _STATUS[package] not in (None, 'it is not installed'):
            warnings.warn(
                f'nanguard: {package} is installed, but '
                f'{_STATUS[package]}; the mmnanguard modules that need it '
                'are not registered',
                stacklevel=2,
            )
    return _STATUS[package]


def is_available(package: str) -> bool:
    """Whether ``package`` (``'mmrotate'``, ``'mmseg'``, ``'mmyolo'``,
    ``'mmpretrain'``, ``'mmpose'`` or ``'mmocr'``) imports.

    Args:
        package (str): An import name from :data:`INSTALL`.

    Returns:
        bool: True when it imports.
    """
    return unavailable_reason(package) is None


def missing_message(what: str, package: str, in_config: bool = True) -> str:
    """The message of :class:`MissingPackageError` for ``what``.

    Args:
        what (str): What needs the package, e.g. ``"type='SafeGDLoss'"``.
        package (str): An import name from :data:`INSTALL`.
        in_config (bool): ``what`` is a config entry (the message then
            also says to remove it). Defaults to True.

    Returns:
        str: A message naming ``what``, the package, why it is unavailable
        and the install line.
    """
    reason = unavailable_reason(package) or 'it is not importable'
    message = (
        f'{what} needs {package}, but {reason}. Install it with '
        f'{INSTALL[package]}'
    )
    return message + (' or remove it from the config.' if in_config else '.')


def _placeholder(name: str, package: str) -> Callable[..., Any]:
    """A registrable function that raises the clear error when built."""

    def build(*args: Any, **kwargs: Any) -> Any:
        raise MissingPackageError(
            missing_message(f"type='{name}'", package), name=package
        )

    build.__name__ = build.__qualname__ = name
    build.__doc__ = f'Placeholder: {name} needs {package}.'
    return build


def register_unavailable(
    registry: Registry, names: Iterable[str], package: str
) -> None:
    """Register a placeholder for each of ``names`` in ``registry`` and in
    its root, as :func:`mmnanguard.registry.register_shared` registers the
    real modules.

    Args:
        registry (Registry): An mmnanguard registry.
        names (Iterable[str]): The module names that need ``package``.
        package (str): An import name from :data:`INSTALL`.
    """
    for name in names:
        placeholder = _placeholder(name, package)
        registry.register_module(name=name, module=placeholder)
        registry.parent.register_module(name=name, module=placeholder)


def missing_attribute(
    module: str, names: Iterable[str], package: str
) -> Callable[[str], Any]:
    """A module ``__getattr__`` (PEP 562) for names that need ``package``.

    Args:
        module (str): The module's ``__name__``.
        names (Iterable[str]): Names the module has only with ``package``.
        package (str): An import name from :data:`INSTALL`.

    Returns:
        Callable: ``__getattr__(name)`` that raises
        :class:`MissingPackageError` for ``names`` and ``AttributeError``
        for any other name.
    """
    needing = frozenset(names)

    def __getattr__(name: str) -> Any:
        if name in needing:
            raise MissingPackageError(
                missing_message(f'{module}.{name}', package, False),
                name=package,
            )
        raise AttributeError(f'module {module!r} has no attribute {name!r}')

    return __getattr__


def _named_packages(cfg: Any) -> Iterable[Tuple[str, str]]:
    """``(where, package)`` for each scope or scoped type in ``cfg``."""
    from mmnanguard.config_walk import iter_typed_configs

    if not isinstance(cfg, dict) and hasattr(cfg, 'to_dict'):
        cfg = cfg.to_dict()  # an mmengine Config
    if not isinstance(cfg, dict):
        return
    scope = cfg.get('default_scope')
    if isinstance(scope, str):
        yield f"default_scope='{scope}'", scope
    for path, node in iter_typed_configs(cfg, 'cfg'):
        value = node.get('_scope_')
        if isinstance(value, str):
            yield f"{path}._scope_='{value}'", value
        value = node.get('type')
        if isinstance(value, str) and '.' in value:
            yield f"{path}.type='{value}'", value.split('.', 1)[0]


def require_packages(cfg: Any, filename: Optional[str] = None) -> None:
    """Raise if ``cfg`` names an optional package that does not import.

    Looks at ``default_scope``, every ``_scope_`` and every scoped
    ``type='mmrotate.X'`` (a bare type name that only a missing package
    has is left to the registry, which fails with mmengine's KeyError, or
    with :class:`MissingPackageError` for mmnanguard's own modules).

    Args:
        cfg (dict | Config): A config.
        filename (str, optional): The config file, for the message.

    Raises:
        MissingPackageError: The first such key, with the package, why it
        is unavailable, the install line and ``filename``.
    """
    for where, package in _named_packages(cfg):
        if package in INSTALL and not is_available(package):
            message = missing_message(where, package)
            if filename:
                message = f'{filename}: {message}'
            raise MissingPackageError(message, name=package)


__all__ = [
    'INSTALL',
    'MissingPackageError',
    'is_available',
    'missing_attribute',
    'missing_message',
    'register_unavailable',
    'require_packages',
    'unavailable_reason',
]
