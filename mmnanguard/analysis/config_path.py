# Copyright (c) mmnanguard contributors. All rights reserved.
"""Config paths of the form ``PACKAGE::relative/path.py`` (the configs an
OpenMMLab package ships under ``PACKAGE/.mim/configs``)."""

import importlib.util
import os.path as osp


def resolve_config_path(path: str) -> str:
    """The file that ``path`` names.

    Args:
        path (str): A file path, or ``'mmdet::retinanet/x.py'``.

    Returns:
        str: The file path (not checked for existence).

    Raises:
        ValueError: The package of a ``PACKAGE::`` path is not installed.
    """
    if '::' not in path:
        return path
    package, relative = path.split('::', 1)
    spec = importlib.util.find_spec(package) if package else None
    if spec is None or spec.origin is None:
        raise ValueError(
            f'config {path!r}: package {package!r} is not installed '
            "(expected 'PACKAGE::path/to/config.py', e.g. "
            "'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py')"
        )
    return osp.join(osp.dirname(spec.origin), '.mim', 'configs', relative)
