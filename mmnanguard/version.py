# Copyright (c) mmnanguard contributors. All rights reserved.
__version__ = '0.1.0'


def parse_version_info(version_str: str) -> tuple:
    """Parse a version string into a tuple of ints and strings.

    Args:
        version_str (str): A version string such as ``'0.1.0'``.

    Returns:
        tuple: The version info, e.g. ``(0, 1, 0)``.
    """
    return tuple(int(x) if x.isdigit() else x for x in version_str.split('.'))


version_info = parse_version_info(__version__)
