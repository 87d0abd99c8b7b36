# Copyright (c) mmnanguard contributors. All rights reserved.
"""The data classes of installed OpenMMLab toolboxes, admitted by what
they are rather than by a list of names.

An incident batch of a toolbox that :data:`~.allowlist.BATCH_CLASSES` does
not name (mmocr's ``TextDetDataSample``, a project's own data sample)
holds its ``BaseDataElement`` subclasses. A global ``module.Name`` of such
a file is admitted when all of these hold:

* the top-level package of ``module`` is installed, and its distribution
  declares mmengine or mmcv among its requirements (any extra included:
  mmdet and mmocr list them under ``mim``), so the name can only reach an
  OpenMMLab toolbox, never ``os`` or ``builtins``;
* ``module.Name`` is a class defined in that module;
* it subclasses mmengine's ``BaseDataElement`` (a data sample or its
  ``LabelData``/``InstanceData``/``PixelData`` fields), or mmdet's
  ``BaseBoxes`` or ``BaseInstanceMasks`` where mmdet is installed.

Nothing else is admitted: a function, a runner, a transform or a class of
an unrelated package stays refused, naming the file and the global.
Importing the module runs only installed code; nothing from the file runs.
"""

import importlib
import importlib.metadata as metadata
import re
from typing import Dict, List, Optional, Set, Tuple

#: Distributions whose dependants are OpenMMLab toolboxes.
_FOUNDATIONS = frozenset(
    (
        'mmengine',
        'mmcv',
        'mmcv-full',
        'mmcv-lite',
        'onedl-mmengine',
        'onedl-mmcv',
    )
)
#: Where the admitted base classes live: (module, class name).
_DATA_BASES = (
    ('mmengine.structures', 'BaseDataElement'),
    ('mmdet.structures.bbox', 'BaseBoxes'),
    ('mmdet.structures.mask', 'BaseInstanceMasks'),
)
_NAME = re.compile(r'[A-Za-z0-9_.\-]+')


def _requirement_name(requirement: str) -> str:
    """``'mmengine>=0.7.1; extra == "mim"'`` -> ``'mmengine'``."""
    match = _NAME.match(requirement.strip())
    return match.group(0).lower().replace('_', '-') if match else ''


def openmmlab_packages() -> Set[str]:
    """Top-level packages whose distribution requires mmengine or mmcv.

    Returns:
        set[str]: Importable top-level names (``'mmdet'``, ``'mmocr'``).
    """
    found: Set[str] = set()
    for top, dists in metadata.packages_distributions().items():
        for dist in dists:
            name = dist.lower().replace('_', '-')
            try:
                requires = metadata.requires(dist) or []
            except metadata.PackageNotFoundError:
                continue
            if name in _FOUNDATIONS or any(
                _requirement_name(r) in _FOUNDATIONS for r in requires
            ):
                found.add(top)
    return found


def _data_bases() -> Tuple[type, ...]:
    bases = []
    for module_name, name in _DATA_BASES:
        try:
            bases.append(getattr(importlib.import_module(module_name), name))
        except (ImportError, AttributeError):
            continue
    return tuple(bases)


def toolbox_data_class(
    qualified: str, packages: Set[str], bases: Tuple[type, ...]
) -> Optional[type]:
    """The class ``qualified`` names when it is admitted, else None.

    Args:
        qualified (str): ``'module.Name'``, as a torch file names a global.
        packages (set[str]): :func:`openmmlab_packages`.
        bases (tuple[type]): The admitted base classes.

    Returns:
        type | None: The data class.
    """
    module_name, _, name = qualified.rpartition('.')
    if not module_name or module_name.split('.')[0] not in packages:
        return None
    try:
        module = importlib.import_module(module_name)
    except Exception:  # noqa: BLE001  (a toolbox that cannot import here)
        return None
    found = getattr(module, name, None)
    if (
        isinstance(found, type)
        and found.__module__ == module_name
        and issubclass(found, bases)
    ):
        return found
    return None


def admitted_data_classes(names: List[str]) -> Dict[str, type]:
    """Of the globals ``names``, those that are toolbox data classes.

    Args:
        names (list[str]): ``'module.Name'`` globals outside the fixed
            allowlist.

    Returns:
        dict[str, type]: The admitted classes, by name.
    """
    if not names:
        return {}
    packages, bases = openmmlab_packages(), _data_bases()
    admitted = {}
    for qualified in names:
        found = toolbox_data_class(qualified, packages, bases)
        if found is not None:
            admitted[qualified] = found
    return admitted
