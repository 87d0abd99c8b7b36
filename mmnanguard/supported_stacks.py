# Copyright (c) mmnanguard contributors. All rights reserved.
"""The stacks mmnanguard is tested on, and a check of the installed one.

OpenMMLab's packages and the maintained OneDL fork install the same import
names (``mmengine``, ``mmcv``, ``mmdet``, ``mmrotate``, ``mmseg``) from
different distributions (``mmcv`` or ``onedl-mmcv``). :data:`TESTED`
gives the extras ``upstream``, ``onedl``, ``rotate``, ``onedl-rotate``,
``seg`` and ``onedl-seg`` (:func:`extras_require`; ``pyproject.toml``
declares the same, tests/test_packaging/test_pyproject.py), so
that ``pip install`` into an existing environment accepts exactly the tested
ranges of either family without replacing one by the other.

``import mmnanguard`` calls :func:`check_installed` first: a missing
required package is an ``ImportError`` that says what to install; a version
outside the tested ranges, or both families installed for one import name,
is one warning naming the distribution, its version and the tested range.

This module imports only the standard library at its top (it is read
before the stack is checked).
"""

import warnings
from importlib import metadata
from typing import Dict, List, Optional, Tuple

#: import name -> family -> (distribution, tested version range).
TESTED: Dict[str, Dict[str, Tuple[str, str]]] = {
    'mmengine': {
        'upstream': ('mmengine', '>=0.10.7,<0.11'),
        'onedl': ('onedl-mmengine', '>=0.10.12,<0.11'),
    },
    'mmcv': {
        'upstream': ('mmcv', '>=2.0.1,<2.2'),
        'onedl': ('onedl-mmcv', '>=2.3.6,<2.4'),
    },
    'mmdet': {
        'upstream': ('mmdet', '>=3.1.0,<3.4'),
        'onedl': ('onedl-mmdetection', '>=3.5.1,<3.6'),
    },
    'mmrotate': {
        'upstream': ('mmrotate', '==1.0.0rc1'),
        'onedl': ('onedl-mmrotate', '>=1.2.1,<1.3'),
    },
    'mmseg': {
        'upstream': ('mmsegmentation', '>=1.2.2,<1.3'),
        'onedl': ('onedl-mmsegmentation', '>=1.4.2,<1.5'),
    },
}

#: The toolboxes built on mmdet that the ``toolboxes`` stack tests
#: mmnanguard with (no extras: OpenMMLab releases only), import name ->
#: (distribution, tested version range).
TOOLBOXES: Dict[str, Tuple[str, str]] = {
    'mmyolo': ('mmyolo', '>=0.6.0,<0.7'),
    'mmpretrain': ('mmpretrain', '>=1.2.0,<1.3'),
    'mmpose': ('mmpose', '>=1.3.2,<1.4'),
    'mmocr': ('mmocr', '>=1.0.1,<1.1'),
    'mmaction': ('mmaction2', '>=1.1.0,<1.2'),
}

#: Import names ``import mmnanguard`` needs.
REQUIRED = ('mmengine', 'mmcv', 'mmdet')

#: Optional import name -> the extra's suffix (``rotate``, ``seg``).
OPTIONAL_EXTRAS = {'mmrotate': 'rotate', 'mmseg': 'seg'}

#: Extra packages an optional part needs beyond its toolbox.
EXTRA_PACKAGES = {'mmseg': ['ftfy', 'regex']}

FAMILIES = ('upstream', 'onedl')


def requirement(name: str, family: str) -> str:
    """The tested requirement of import name ``name`` in ``family``, e.g.
    ``'onedl-mmcv>=2.3.6,<2.4'``."""
    return ''.join(TESTED[name][family])


def extra_name(name: str, family: str) -> str:
    """The extra of optional package ``name`` in ``family``: ``rotate``,
    ``seg``, ``onedl-rotate``, ``onedl-seg``."""
    suffix = OPTIONAL_EXTRAS[name]
    return suffix if family == 'upstream' else f'{family}-{suffix}'


def extras_require() -> Dict[str, List[str]]:
    """The extras (``[project.optional-dependencies]`` of
    ``pyproject.toml``).

    Returns:
        dict: ``upstream`` and ``onedl`` (the required packages of each
        family), ``rotate``/``seg`` (upstream) and
        ``onedl-rotate``/``onedl-seg``.
    """
    extras: Dict[str, List[str]] = {}
    for family in FAMILIES:
        extras[family] = [requirement(name, family) for name in REQUIRED]
        for name in OPTIONAL_EXTRAS:
            extras[extra_name(name, family)] = [
                requirement(name, family)
            ] + EXTRA_PACKAGES.get(name, [])
    return extras


def _tested(name: str) -> Dict[str, Tuple[str, str]]:
    """family -> (distribution, range) of an import name of
    :data:`TESTED` or :data:`TOOLBOXES` (upstream only)."""
    if name in TOOLBOXES:
        return {'upstream': TOOLBOXES[name]}
    return TESTED[name]


def installed_distributions(name: str) -> Dict[str, str]:
    """The installed distributions that provide import name ``name``.

    Args:
        name (str): An import name of :data:`TESTED` or :data:`TOOLBOXES`.

    Returns:
        dict: family -> installed version, for each family whose
        distribution is installed.
    """
    found = {}
    for family, (dist, _) in _tested(name).items():
        try:
            found[family] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return found


def installed_family() -> Optional[str]:
    """The family of the installed mmdet (``'upstream'`` or ``'onedl'``),
    or None where no known distribution provides it."""
    found = installed_distributions('mmdet')
    if 'onedl' in found:
        return 'onedl'
    return 'upstream' if found else None


def install_line(name: str) -> str:
    """How to install the optional part ``name`` on the installed family.

    Args:
        name (str): ``'mmrotate'``, ``'mmseg'`` or a toolbox of
            :data:`TOOLBOXES`.

    Returns:
        str: e.g. ``pip install "mmnanguard[onedl-rotate]"
        (onedl-mmrotate>=1.2.1,<1.3)``, or ``pip install
        "mmyolo>=0.6.0,<0.7"``.
    """
    if name in TOOLBOXES:
        line = f'pip install "{"".join(TOOLBOXES[name])}"'
        if name == 'mmpose':
            line += (
                ' --no-deps (its chumpy requirement does not build; '
                'install json_tricks, munkres and xtcocotools with numpy<2 '
                'beside it)'
            )
        if name == 'mmocr':
            line += ' (its imgaug needs numpy<2)'
        if name == 'mmaction':
            line += (
                ' --no-deps, and decord beside it (the 1.2.0 wheel lacks '
                'its own mmaction.models.localizers.drn and cannot be '
                'imported)'
            )
        return line
    family = installed_family() or 'upstream'
    line = (
        f'pip install "mmnanguard[{extra_name(name, family)}]" '
        f'({requirement(name, family)})'
    )
    if name == 'mmrotate' and family == 'upstream':
        line += (
            ', which asserts mmdet <= 3.1.0 and so needs mmcv 2.0.x; on a '
            'newer mmdet use the OneDL packages, pip install '
            '"mmnanguard[onedl,onedl-rotate]"'
        )
    return line


def version_problems() -> List[str]:
    """What :func:`check_installed` warns about (empty when nothing).

    Returns:
        list[str]: One sentence per installed distribution outside its
        tested range, and per import name provided by both families.
    """
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    problems = []
    for name in list(TESTED) + list(TOOLBOXES):
        found = installed_distributions(name)
        if len(found) > 1:
            dists = ' and '.join(
                f'{TESTED[name][f][0]} {v}' for f, v in found.items()
            )
            problems.append(
                f'both {dists} are installed; they install the same '
                f'`{name}` package over each other, so keep one'
            )
        for family, version in found.items():
            dist, spec = _tested(name)[family]
            try:
                tested = Version(version) in SpecifierSet(
                    spec, prereleases=True
                )
            except InvalidVersion:
                tested = False
            if not tested:
                problems.append(
                    f'{dist} {version} is outside the tested range {spec}'
                )
    return problems


def check_installed() -> None:
    """Check the installed stack before mmnanguard imports any of it.

    Raises:
        ImportError: A package of :data:`REQUIRED` cannot be found; the
            message names it and the two install lines.
    """
    import importlib.util

    for name in REQUIRED:
        if importlib.util.find_spec(name) is None:
            options = ' or '.join(
                f'pip install "mmnanguard[{family}]" ('
                + ', '.join(TESTED[n][family][0] for n in REQUIRED)
                + ')'
                for family in FAMILIES
            )
            raise ImportError(
                f'mmnanguard needs {name}, which is not installed. Install '
                f'the OpenMMLab packages or the OneDL fork: {options}.',
                name=name,
            )
    problems = version_problems()
    if problems:
        warnings.warn(
            'nanguard: mmnanguard is tested on the stacks of docs/stacks.md '
            '("Supported stacks"); here ' + '; '.join(problems) + '.',
            stacklevel=3,
        )


__all__ = [
    'FAMILIES',
    'REQUIRED',
    'TESTED',
    'TOOLBOXES',
    'check_installed',
    'extra_name',
    'extras_require',
    'install_line',
    'installed_distributions',
    'installed_family',
    'requirement',
    'version_problems',
]
